"""A kernel that compiles per kind of call (tests/e2e/plugins/compiles_ahead.py, as flex-attention
does on the GPU) compiles each kind ahead, on attnreplay's thread beside the other kernels, while
the replay goes on: its part of each call is deferred until the compilations are done, the other
kernels' parts are not, and the calls are still reported in order, each with every kernel. The
compilations are in the record, apart from every figure, and a first run finds its kind compiled."""
from pathlib import Path

import numpy as np
import torch

import attnreplay_h5
from conftest import FAST, load_json, run_attnreplay

PLUGIN = Path(__file__).parent / "plugins" / "compiles_ahead.py"


def make_capture(path):
    """6 fp32 calls of two kinds (causal or not), each of its own length."""
    rng = np.random.default_rng(0)
    calls = []
    for i, seq in enumerate((40, 56, 72, 88, 104, 120)):
        q, k, v = (torch.from_numpy(rng.standard_normal((1, 2, seq, 16)).astype(np.float32)) for _ in range(3))
        calls.append({"call_index": i, "op": "aten::scaled_dot_product_attention", "q": q, "k": k, "v": v,
                      "is_causal": i % 2 == 1})
    attnreplay_h5.write_calls(str(path), calls)


def test_kinds_compile_ahead_while_other_kernels_replay(tmp_path):
    make_capture(tmp_path / "c.h5")
    result = run_attnreplay("run", tmp_path / "c.h5", "--kernel-module", PLUGIN, "--kernels", "torch-math,compiles-ahead",
                            "--json", tmp_path / "r.json", *FAST, check=0)
    record = load_json(tmp_path / "r.json")
    ahead = record["compilations_ahead"]
    assert sorted(c["kind"] for c in ahead) == ["d16", "d16, causal"], ahead
    assert all(c["kernel"] == "compiles-ahead" and c["seconds"] >= 1.0 for c in ahead), ahead
    calls = record["calls"]
    assert [c["call_index"] for c in calls] == list(range(6))
    for call in calls:
        rows = {k["kernel"]: k for k in call["kernels"]}
        assert list(rows) == ["torch-math", "compiles-ahead"], list(rows)
        assert rows["compiles-ahead"]["status"] == "not_verified" and rows["compiles-ahead"]["error"]["rel_l2"] < 1e-5
        assert "compile_s" not in rows["compiles-ahead"], "its kind was compiled ahead"
    # The compilations (2 s) went beside torch-math's part of later calls: call 1 was replayed
    # before call 0 was done.
    assert calls[1]["replay_at_s"]["began"] < calls[0]["replay_at_s"]["ended"]
    assert "compiles-ahead compiled 2 kinds of call ahead" in result.stdout
    # The table is in call order all the same.
    printed = [line.split(": call ")[1].split()[0] for line in result.stdout.splitlines() if "c.h5: call " in line]
    assert printed == [str(i) for i in range(6)], printed


def test_a_generated_call_waits_for_its_kernel(tmp_path):
    """A call of its own (--shape) has nothing to go on with: the kernel's first run compiles, as
    warm_up's compile_s says."""
    run_attnreplay("run", "--shape", "1,2,32,16", "--dtype", "fp32", "--kernel-module", PLUGIN, "--kernels",
                   "compiles-ahead", "--json", tmp_path / "r.json", *FAST, check=0)
    record = load_json(tmp_path / "r.json")
    [row] = [k for k in record["calls"][0]["kernels"] if k["kernel"] == "compiles-ahead"]
    assert row["compile_s"] >= 1.0 and record["compilations_ahead"] == []
