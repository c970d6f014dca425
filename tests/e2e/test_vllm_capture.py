"""vLLM's builds of flash-attn (tests/e2e/jobs/vllm_flash_attn_job.py): _vllm_fa2_C::varlen_fwd,
_vllm_fa2_C::fwd_kvcache and _vllm_fa3_C::fwd, registered under their own names and schemas, are
captured by default in the thd form, their outputs taken from the Tensor[] they return, and replayed:
the fp64 reference computes what each op computed; `gen`, context parallelism left off and an
unread cu_seqlens_k placeholder change nothing; keys fwd_kvcache appends are refused by name."""
import numpy as np
import pytest

from capture_common import capture_and_replay

CALLS = ["fa2_paged", "fa2_kvcache_decode", "fa2_kvcache_appended", "fa3_sinks"]


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vllm")
    _, calls, report, _ = capture_and_replay("vllm_flash_attn_job.py", folder, "reference,torch-math")
    return folder, calls, report


def test_capture_changes_nothing_and_stores_each_call_in_thd(replayed):
    folder, calls, _ = replayed
    plain, captured = np.load(folder / "plain.npz"), np.load(folder / "captured.npz")
    assert sorted(plain.files) == sorted(CALLS)
    assert all(np.array_equal(plain[k], captured[k]) for k in plain.files)
    assert [c["op"] for c in calls] == (["_vllm_fa2_C::varlen_fwd"] + ["_vllm_fa2_C::fwd_kvcache"] * 2 +
                                        ["_vllm_fa3_C::fwd"])
    assert all(c["layout"] == "thd" and c["causal_alignment"] == "bottom_right" for c in calls)
    paged, decode, appended, sinks = calls
    # Pages (6, 1, 3), (8,) and (2, 9, 5) of 4 tokens hold 11, 3 and 9 keys: 7 pages read of 10.
    assert paged["k"].shape == (7, 4, 2, 16) and np.array_equal(paged["seqused_k"], [11, 3, 9])
    assert paged["cu_seqlens_k"] is None  # the placeholder vLLM passes is not kept
    assert (paged["window_left"], paged["window_right"], paged["softcap"]) == (6, 0, 25.0)
    # fwd_kvcache: the keys are kcache's pages, seqlens_k counts them, one query a sequence.
    assert decode["k"].shape == (7, 4, 2, 16) and np.array_equal(decode["seqused_k"], [11, 3, 9])
    assert decode["q"].shape == (3, 4, 16) and decode["out"].shape == (3, 4, 16)
    assert appended["metadata"]["arg.k"] == "tensor Float [3,1,2,16]"
    assert sinks["sinks"].shape == (4,)
    for call in calls:
        assert call["out"] is not None, call["op"]  # from the Tensor[] the op returned


def test_the_reference_computes_what_each_call_computed(replayed):
    _, _, report = replayed
    for name, call in zip(CALLS, report["calls"]):
        if name == "fa2_kvcache_appended":
            continue
        kernels = {k["kernel"]: k for k in call["kernels"]}
        assert kernels["model-output"]["error"]["rel_l2"] < 1e-6, (name, kernels["model-output"])
    decode = {k["kernel"]: k for k in report["calls"][1]["kernels"]}["torch-math"]
    assert decode["status"] == "not_verified" and decode["error"]["rel_l2"] < 1e-6, decode


def test_keys_fwd_kvcache_appends_are_refused_by_name(replayed):
    _, _, report = replayed
    appended = report["calls"][2]
    assert all(k["status"] == "not_supported" for k in appended["kernels"])
    reason = appended["kernels"][0]["reason"]
    assert "k=tensor Float [3,1,2,16] (keys appended to a KV cache)" in reason, reason
