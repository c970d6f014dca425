"""SGLang's FlashAttention-3 backend (tests/e2e/jobs/sglang_fa3_job.py): sgl_kernel::fwd, registered
under sgl-kernel's own name and schema, is captured by default, in the thd form with the pages each
call reads, and replayed: the fp64 reference computes what the op computed, cu_seqlens_k_new without
k_new (every SGLang prefill) changes nothing, and keys the op appends are refused by name."""
import numpy as np
import pytest

from capture_common import capture_and_replay

CALLS = ["extend", "decode_window_softcap", "decode_sinks", "appended"]


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sglang")
    _, calls, report, _ = capture_and_replay("sglang_fa3_job.py", folder, "reference,torch-math")
    return folder, calls, report


def test_capture_changes_nothing_and_stores_each_call_in_thd(replayed):
    folder, calls, _ = replayed
    plain, captured = np.load(folder / "plain.npz"), np.load(folder / "captured.npz")
    assert sorted(plain.files) == sorted(CALLS)
    assert all(np.array_equal(plain[k], captured[k]) for k in plain.files)
    assert [c["op"] for c in calls] == ["sgl_kernel::fwd"] * 4
    assert all(c["layout"] == "thd" and c["causal_alignment"] == "bottom_right" for c in calls)
    extend, windowed, sinks, _ = calls
    # Page size 1: the call reads 7 + 6 + 6 of the pool's 40 token slots, stored renumbered.
    assert extend["k"].shape == (19, 1, 2, 16) and np.array_equal(extend["seqused_k"], [7, 6, 6])
    assert np.array_equal(extend["cu_seqlens_q"], [0, 3, 4, 10]) and extend["q"].shape == (10, 4, 16)
    # Pages of 4: 3 + 2 + 3 pages read of the 12.
    assert windowed["k"].shape == (8, 4, 2, 16) and np.array_equal(windowed["seqused_k"], [10, 6, 12])
    assert (windowed["window_left"], windowed["window_right"], windowed["softcap"]) == (5, 0, 30.0)
    assert sinks["sinks"].shape == (4,)
    for call in calls:
        args = {k[4:] for k in call["metadata"] if k.startswith("arg.")}
        assert not args & {"cu_seqlens_q", "seqused_k", "page_table", "sinks", "softcap"}, args


def test_the_reference_computes_what_each_call_computed(replayed):
    _, _, report = replayed
    for name, call in zip(CALLS[:3], report["calls"]):
        kernels = {k["kernel"]: k for k in call["kernels"]}
        assert kernels["model-output"]["error"]["rel_l2"] < 1e-6, (name, kernels["model-output"])
    extend, windowed, sinks = ({k["kernel"]: k for k in c["kernels"]}["torch-math"] for c in report["calls"][:3])
    # torch's math backend replays the extend one sequence at a time; it computes no softcap or sinks.
    assert extend["status"] == "not_verified" and extend["error"]["rel_l2"] < 1e-6, extend
    assert windowed["reason"] == "the call has a softcap of 30, which this kernel does not compute"
    assert sinks["reason"] == "the call has attention sinks, which this kernel does not compute"


def test_keys_the_op_appends_are_refused_by_name(replayed):
    _, _, report = replayed
    appended = report["calls"][3]
    assert all(k["status"] == "not_supported" for k in appended["kernels"])
    reason = appended["kernels"][0]["reason"]
    assert "k_new=tensor Float [3,1,2,16] (keys appended to a KV cache)" in reason, reason
