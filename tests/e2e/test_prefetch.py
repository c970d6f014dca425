"""Reading ahead (replay/run/prefetch.h): the calls come in order with the same results whatever the
read-ahead budget, and --save-inputs writes HDF5 on the replaying thread while the reader reads
HDF5 on its own (the HDF5 library here is not built thread-safe: formats/hdf5_format.cpp locks)."""
import numpy as np

import attnreplay_h5
from conftest import FAST, load_json, run_attnreplay


def errors(record):
    return [(c["call_index"], k["kernel"], k.get("error")) for c in record["calls"] for k in c["kernels"]]


def test_read_ahead_changes_nothing_but_the_wait(tmp_path):
    """Read-ahead changes only the wait; each call's record says when its replay began and ended."""
    rng = np.random.default_rng(2)
    calls = []
    for index in range(12):
        q, k, v = (rng.standard_normal((1, 2, 40 + 8 * (index % 3), 16), dtype=np.float32) for _ in range(3))
        calls.append({"call_index": index, "q": q, "k": k, "v": v})
    capture = tmp_path / "cap.h5"
    attnreplay_h5.write_calls(str(capture), calls)
    ahead, one = tmp_path / "ahead.json", tmp_path / "one.json"
    run_attnreplay("run", capture, "--kernels", "reference,torch-math", "--json", ahead, "-q", "--save-inputs",
                   tmp_path / "saved.h5", *FAST, check=0)
    run_attnreplay("run", capture, "--kernels", "reference,torch-math", "--json", one, "-q", "--prefetch-memory", "1",
                   *FAST, check=0)
    assert [c["call_index"] for c in load_json(ahead)["calls"]] == list(range(12))
    assert errors(load_json(ahead)) == errors(load_json(one))
    saved = attnreplay_h5.read_calls(str(tmp_path / "saved.h5"))
    assert [c["call_index"] for c in saved] == list(range(12))
    for original, copy in zip(calls, saved):
        np.testing.assert_array_equal(original["q"], copy["q"])
    # Where the wall time went: each call's replay, on the process's clock, in order, before the record.
    record = load_json(ahead)
    windows = [(c["replay_at_s"]["began"], c["replay_at_s"]["ended"]) for c in record["calls"]]
    assert 0 < windows[0][0] and all(began <= ended for began, ended in windows)
    assert all(earlier[1] <= later[0] for earlier, later in zip(windows, windows[1:]))
    assert windows[-1][1] <= record["recorded_at_s"] < 600
    refused = run_attnreplay("run", capture, "--prefetch-memory", "0", check=2)
    assert "--prefetch-memory" in refused.stderr
