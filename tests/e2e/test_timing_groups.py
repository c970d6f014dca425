"""Time per shape, judge per call (replay/run/timing_groups.h): calls of one shape share a timing per
kernel, every call keeps its own error statistics, and --time-every-call times each."""
import numpy as np

import attnreplay_h5
from conftest import FAST, load_json, run_attnreplay

KERNELS = "reference,torch-math,torch-flash-cpu"


def write_capture(path):
    """Six calls: four of one shape (different values), two of another, one of them causal."""
    rng = np.random.default_rng(0)
    calls = []
    for index, (seq, causal) in enumerate([(48, False), (48, False), (32, False), (48, False), (32, True), (48, False)]):
        q, k, v = (rng.standard_normal((1, 2, seq, 16), dtype=np.float32) for _ in range(3))
        calls.append({"call_index": index, "q": q, "k": k, "v": v, "is_causal": causal})
    attnreplay_h5.write_calls(str(path), calls)


def rows(report):
    return {(c["call_index"], k["kernel"]): k for c in report["calls"] for k in c["kernels"]}


def test_calls_of_one_shape_share_their_timing_and_keep_their_errors(tmp_path):
    capture = tmp_path / "cap.h5"
    write_capture(capture)
    grouped, every = tmp_path / "grouped.json", tmp_path / "every.json"
    result = run_attnreplay("run", capture, "--kernels", KERNELS, "--json", grouped, *FAST, check=0)
    run_attnreplay("run", capture, "--kernels", KERNELS, "--time-every-call", "--json", every, *FAST, check=0)
    g, e = rows(load_json(grouped)), rows(load_json(every))
    for kernel in KERNELS.split(","):
        # Calls 0, 2 and 4 open their groups (48, 32, 32 causal) and are timed; 1, 3, 5 reuse call 0's.
        for timed in (0, 2, 4):
            assert "timing_shared_from" not in g[(timed, kernel)]
        for shared in (1, 3, 5):
            row = g[(shared, kernel)]
            assert row["timing_shared_from"] == f"{capture}: call 0", row
            assert row["timing"] == g[(0, kernel)]["timing"]
        for call in range(6):
            assert "timing_shared_from" not in e[(call, kernel)]
            # Every call is still judged on its own output: the same figures either way.
            assert g[(call, kernel)]["error"] == e[(call, kernel)]["error"]
    # Different values give different errors: each call was really run.
    assert g[(1, "torch-math")]["error"]["max_abs"] != g[(3, "torch-math")]["error"]["max_abs"]
    # The calls that reuse a timing are one line each under the timed call's table.
    assert "  call 1: timings measured on call 0 (same shape); 3 kernels ran" in result.stdout


def test_more_timed_calls_per_group(tmp_path):
    capture = tmp_path / "cap.h5"
    write_capture(capture)
    out = tmp_path / "r.json"
    run_attnreplay("run", capture, "--kernels", "torch-math", "--timed-calls-per-group", "2", "--json", out, *FAST,
                   check=0)
    r = rows(load_json(out))
    assert "timing_shared_from" not in r[(0, "torch-math")] and "timing_shared_from" not in r[(1, "torch-math")]
    assert r[(3, "torch-math")]["timing_shared_from"].endswith("call 0")
    assert r[(5, "torch-math")]["timing_shared_from"].endswith("call 0")


def test_audit_groups_by_default(tmp_path):
    capture = tmp_path / "cap.h5"
    write_capture(capture)
    out = tmp_path / "audit.json"
    run_attnreplay("audit", capture, "--kernels", "torch-math", "--json", out, "-q", *FAST, check=0)
    calls = load_json(out)["calls"]
    shared = [c["call_index"] for c in calls for k in c["kernels"] if "timing_shared_from" in k]
    assert shared == [1, 3, 5]
