"""Attention entry points that are Python functions, not dispatcher ops (FlashInfer's wrappers,
its MLA wrapper included, and single-request functions, flash-attn 2's flash_attn_with_kvcache), captured with no change to the
job: capture's Python side (capture/python_entry_points.py) wraps them as their modules are
imported and hands each call, after it ran, to capture. Driven by
tests/e2e/jobs/python_entry_points_job.py over the stand-ins of tests/e2e/stand_ins, which follow
the libraries' signatures and conventions and compute in fp64 on the CPU (no real FlashInfer or
flash-attn runs here: neither has a CPU build)."""
import numpy as np
import pytest

from capture_common import attncap_lines, capture_and_replay, capture_files, read_calls, run_python_job, the_capture

CALLS = ["decode_softcap", "decode_hnd_window_sinks", "prefill_paged_causal", "prefill_ragged_window",
         "single_prefill", "single_decode", "kvcache_appended", "kvcache_paged_window", "mla_paged_causal",
         "fp16_qk_reduction"]
OPS = (["flashinfer::BatchDecodeWithPagedKVCacheWrapper.run"] * 2 +
       ["flashinfer::BatchPrefillWithPagedKVCacheWrapper.run", "flashinfer::BatchPrefillWithRaggedKVCacheWrapper.run",
        "flashinfer::single_prefill_with_kv_cache", "flashinfer::single_decode_with_kv_cache"] +
       ["flash_attn::flash_attn_with_kvcache"] * 2 + ["flashinfer::BatchMLAPagedAttentionWrapper.run",
                                                      "flashinfer::BatchPrefillWithPagedKVCacheWrapper.run"])
FP16_ROUNDING = 2.0 ** -11  # the outputs are fp16: the reference can only match them to this


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("entry_points")
    captured, calls, report, _ = capture_and_replay("python_entry_points_job.py", folder,
                                                    "reference,torch-math,torch-flash-cpu")
    return folder, calls, report, captured.stderr


def kernels_of(call):
    return {k["kernel"]: k for k in call["kernels"]}


def test_capture_changes_nothing_and_names_each_entry_point(replayed):
    folder, calls, _, stderr = replayed
    plain, captured = np.load(folder / "plain.npz"), np.load(folder / "captured.npz")
    assert list(plain.files) == CALLS
    assert all(np.array_equal(plain[name], captured[name]) for name in CALLS)
    assert [c["op"] for c in calls] == OPS
    assert all(c["layout"] == "thd" and c["causal_alignment"] == "bottom_right" for c in calls)
    # The call site is the job's line, not capture's wrapper; each site is a layer of its own.
    assert all("python_entry_points_job.py:" in c["metadata"]["call_site"] for c in calls)
    assert [c["metadata"]["layer"] for c in calls] == [str(i) for i in range(len(CALLS))]
    # The entry point's own wall time: the stand-ins compute in Python, far above a copy's time.
    assert all(float(c["metadata"]["duration_s"]) > 1e-4 for c in calls)
    assert not [line for line in attncap_lines(stderr) if "not observed" in line or "not captured" in line], stderr


def test_flashinfer_pages_are_stored_as_the_call_read_them(replayed):
    _, calls, _, _ = replayed
    decode, _, prefill, ragged, single_prefill, single_decode = calls[:6]
    # 16 pages in the cache, 6 read: stored renumbered, with the keys each sequence uses.
    assert decode["q"].shape == (3, 4, 16) and decode["k"].shape == (6, 4, 2, 16)
    assert np.array_equal(decode["cu_seqlens_q"], [0, 1, 2, 3]) and np.array_equal(decode["seqused_k"], [7, 3, 10])
    assert sorted(decode["block_table"][decode["block_table"] >= 0].tolist()) == list(range(6))
    # plan's buffers were overwritten before run: the record has what plan was given.
    assert np.array_equal(prefill["cu_seqlens_q"], [0, 5, 6, 9]) and np.array_equal(prefill["seqused_k"], [7, 4, 9])
    assert np.array_equal(ragged["cu_seqlens_k"], [0, 7, 11, 20]) and ragged["k"].shape == (20, 2, 16)
    assert decode["softcap"] == 30 and decode["scale"] == pytest.approx(0.3)
    assert ragged["window_left"] == 3 and ragged["is_causal"]
    assert single_decode["q"].shape == (1, 4, 16) and single_prefill["q"].shape == (6, 4, 16)
    for call in calls:
        args = {k[4:] for k in call["metadata"] if k.startswith("arg.")}
        assert not args & {"paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len", "sm_scale",
                           "logits_soft_cap", "window_left", "kv_layout", "causal", "sinks"}, args


def test_flash_attn_with_kvcache_reads_the_cache_with_the_keys_it_appended(replayed):
    _, calls, _, _ = replayed
    appended, paged = calls[6], calls[7]
    # cache_seqlens [5, 8] and 2 keys appended to each: 7 and 10 keys read, from the cache.
    assert np.array_equal(appended["cu_seqlens_k"], [0, 7, 17]) and appended["k"].shape == (17, 2, 16)
    assert appended["metadata"]["arg.k_appended"] == "tensor Half [2,2,2,16]"
    assert paged["k"].shape == (5, 4, 2, 16) and np.array_equal(paged["seqused_k"], [6, 9])
    assert paged["window_left"] == 2 and paged["softcap"] == 10


def test_flashinfer_mla_is_stored_as_attention_over_one_shared_key_head(replayed):
    _, calls, report, _ = replayed
    mla = calls[8]
    # Queries [q_nope, q_pe] (32 + 8 channels), keys [ckv, kpe] and values ckv, one head for all
    # 4 query heads; 2 + 3 + 2 pages of 4 read of the 12, with 6, 9 and 5 tokens.
    assert mla["q"].shape == (6, 4, 40) and mla["out"].shape == (6, 4, 32)
    assert mla["k"].shape == (7, 4, 1, 40) and mla["v"].shape == (7, 4, 1, 32)
    assert np.array_equal(mla["cu_seqlens_q"], [0, 2, 3, 6]) and np.array_equal(mla["seqused_k"], [6, 9, 5])
    assert mla["is_causal"] and mla["scale"] == pytest.approx(0.2)
    args = {k[4:] for k in mla["metadata"] if k.startswith("arg.")}
    assert not args & {"q_nope", "q_pe", "ckv_cache", "kpe_cache", "kv_indptr", "kv_indices", "kv_len_arr"}, args
    assert kernels_of(report["calls"][8])["torch-math"]["status"] == "not_verified"


def test_the_reference_computes_what_each_entry_point_computed(replayed):
    _, _, report, _ = replayed
    for name, call in zip(CALLS[:-1], report["calls"]):
        error = kernels_of(call)["model-output"]["error"]
        assert error["rel_l2"] < FP16_ROUNDING, (name, error)
    assert report["calls"][1]["extensions"] == ["a sliding window (left 4)", "attention sinks"]


def test_an_argument_the_record_cannot_hold_is_refused_by_name(replayed):
    _, _, report, _ = replayed
    flagged = report["calls"][-1]
    assert all(k["status"] == "not_supported" for k in flagged["kernels"])
    assert "use_fp16_qk_reduction=True (Q·K accumulated in fp16)" in flagged["kernels"][0]["reason"]


def test_attncap_ops_selects_entry_points_by_the_names_they_are_recorded_under(tmp_path):
    run_python_job("python_entry_points_job.py", "--save", tmp_path / "out.npz", out=tmp_path / "caps",
                   ATTNCAP_OPS="flash_attn")
    calls = read_calls(the_capture(tmp_path / "caps"))
    assert [c["op"] for c in calls] == ["flash_attn::flash_attn_with_kvcache"] * 2


def test_attncap_calls_counts_every_entry_point_call_and_records_those_selected(tmp_path):
    run_python_job("python_entry_points_job.py", "--save", tmp_path / "out.npz", out=tmp_path / "caps",
                   ATTNCAP_CALLS="1,6")
    calls = read_calls(the_capture(tmp_path / "caps"))
    assert [(c["call_index"], c["op"]) for c in calls] == [(1, OPS[1]), (6, OPS[6])]


def test_nothing_is_wrapped_when_capture_is_off(tmp_path):
    result = run_python_job("python_entry_points_job.py", "--save", tmp_path / "out.npz", out=tmp_path / "caps",
                            ATTNCAP_ENABLE="0")
    assert capture_files(tmp_path / "caps") == [] and attncap_lines(result.stderr) == []
