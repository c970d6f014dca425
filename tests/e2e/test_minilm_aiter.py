"""A real model end to end: all-MiniLM-L6-v2's six SDPA calls, captured in aiter's folder format by
examples/capture_minilm_aiter.py, replayed through every CPU kernel, and converted to HDF5."""

import os
import subprocess
import sys

import pytest

from conftest import FAST, SOURCE_DIR, load_json, run_attnreplay

LAYERS = 6


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("minilm")
    capture = folder / "capture"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")  # never the network
    result = subprocess.run([sys.executable, str(SOURCE_DIR / "examples" / "capture_minilm_aiter.py"),
                             "--out", str(capture)], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"sdpa calls seen: {LAYERS}" in result.stdout
    replay = run_attnreplay("run", capture, "--kernels", "all,reference", "--refcheck", "--json", folder / "pt.json", "-q",
                            *FAST)
    return folder, capture, replay, load_json(folder / "pt.json")


def test_capture_is_an_aiter_folder(minilm):
    _, capture, _, _ = minilm
    names = sorted(p.name for p in capture.iterdir())
    assert names == sorted([f"sdpa_input_{i}.pt" for i in range(LAYERS)] + ["sdpa_metadata.pt"])


def test_replay_passes(minilm):
    _, capture, replay, report = minilm
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert report["input_errors"] == []
    calls = report["calls"]
    assert [c["call_index"] for c in calls] == list(range(LAYERS))  # the metadata file is no call
    for call in calls:
        assert call["dtype"] == "float32" and call["op"] == "sdpa" and call["layout"] == "bhsd"
        assert call["mask"] == "bool 4x1x21x21"  # 4 padded sentences of up to 21 tokens
        assert call["shape"] == {"batch": 4, "heads_q": 12, "heads_kv": 12, "seq_q": 21, "seq_kv": 21,
                                 "head_dim_qk": 32, "head_dim_vo": 32}
        assert call["scale"] == pytest.approx(32 ** -0.5, rel=1e-7)  # the model passes it explicitly
        statuses = {k["kernel"]: k["status"] for k in call["kernels"]}
        for kernel in ("reference", "torch-flash-cpu", "torch-math", "model-output"):
            assert statuses.pop(kernel) == "passed", (kernel, call["kernels"])
        # What is left is for other devices: declined without one, passed with one.
        assert set(statuses.values()) <= {"not_supported", "passed"}, statuses
        model = next(k for k in call["kernels"] if k["kernel"] == "model-output")
        assert "timing" not in model  # the model's own output is compared, not timed
        assert model["error"]["elements"] == 4 * 12 * 21 * 32 and model["error"]["nan_count"] == 0
        assert 0 < model["error"]["max_abs"] < 1e-5  # fp32 attention rounding, not a different answer


def test_converted_to_hdf5_gives_the_same_errors(minilm):
    folder, capture, _, report = minilm
    run_attnreplay("convert", capture, folder / "minilm.h5", check=0)
    info = run_attnreplay("info", folder / "minilm.h5", check=0).stdout
    assert f"attnreplay-hdf5 v2, {LAYERS} calls" in info and f"{LAYERS} x sdpa" in info
    run_attnreplay("run", folder / "minilm.h5", "--kernels", "reference", "--refcheck", "--json", folder / "h5.json",
                   "-q", *FAST, check=0)
    converted = load_json(folder / "h5.json")["calls"]
    assert len(converted) == LAYERS
    for from_pt, from_h5 in zip(report["calls"], converted):
        assert from_h5["call_index"] == from_pt["call_index"] and from_h5["mask"] == from_pt["mask"]
        assert from_h5["scale"] == from_pt["scale"]
        model_pt = next(k for k in from_pt["kernels"] if k["kernel"] == "model-output")["error"]
        model_h5 = next(k for k in from_h5["kernels"] if k["kernel"] == "model-output")["error"]
        assert model_h5 == model_pt  # the same inputs and output, bit for bit: the same statistics
