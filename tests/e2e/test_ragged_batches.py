"""Ragged (varlen) and paged batches, captured and replayed (docs/format.md, thd). flash-attn 2's
varlen op and FlashAttention-3's forward op, registered under their own names and schemas by
tests/e2e/jobs/flash_attn_varlen_job.py, are captured in the record's thd form: packed rows, the
pages a call reads (not the whole cache), per-sequence key counts. The fp64 reference computes what
the ops computed, torch's backends replay them one sequence at a time, the work is summed over the
sequences, and keys appended to a cache (which the record cannot hold) are refused by name."""
import os

import numpy as np
import pytest

from capture_common import capture_and_replay, read_calls, the_capture
from conftest import FAST, load_json, run_attnreplay

CALLS = ["varlen", "window_softcap_used", "paged", "fa3_paged_decode", "fa3_varlen_window", "fa3_dense_cache",
         "fa3_appended"]
Q_LENS = [5, 1, 9]
PLUGINS = os.path.join(os.path.dirname(__file__), "plugins", "varlen_plugins.py")
# The library adapters registered again as '<name>-on-cpu', run against the libraries' stand-ins.
ADAPTERS_ON_CPU = os.path.join(os.path.dirname(__file__), "plugins", "adapters_on_cpu.py")
STAND_INS = os.path.join(os.path.dirname(__file__), "stand_ins")


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("varlen")
    _, calls, report, replay = capture_and_replay("flash_attn_varlen_job.py", folder,
                                                  "reference,torch-math,torch-flash-cpu")
    return folder, calls, report, replay.stdout


def test_capture_changes_nothing_and_stores_the_ragged_form(replayed):
    folder, calls, _, _ = replayed
    plain, captured = np.load(folder / "plain.npz"), np.load(folder / "captured.npz")
    assert sorted(plain.files) == sorted(CALLS)
    assert all(np.array_equal(plain[k], captured[k]) for k in plain.files)
    assert [c["op"] for c in calls] == ["flash_attn::_flash_attn_varlen_forward"] * 3 + ["flash_attn_3::fwd"] * 4
    assert all(c["layout"] == "thd" and c["causal_alignment"] == "bottom_right" for c in calls)
    varlen, used, paged, decode, _, dense_cache, _ = calls
    assert np.array_equal(varlen["cu_seqlens_q"], [0, 5, 6, 15]) and np.array_equal(varlen["cu_seqlens_k"], [0, 7, 11, 20])
    assert varlen["q"].shape == (15, 4, 16) and varlen["k"].shape == (20, 2, 16) and varlen["out"].shape == (15, 4, 16)
    assert np.array_equal(used["seqused_k"], [6, 4, 2])
    # The cache holds 16 pages; the call reads 6 (pages 3, 9 / 0 / 12, 5, 14), stored renumbered.
    assert paged["k"].shape == (6, 4, 2, 16) and paged["cu_seqlens_k"] is None
    assert np.array_equal(paged["seqused_k"], [7, 4, 9])
    assert np.array_equal(paged["block_table"], [[1, 3, -1], [0, -1, -1], [4, 2, 5]])
    # A dense (batch, 1, heads, dim) decode query is stored as its rows; so is its output.
    assert decode["q"].shape == (3, 4, 16) and decode["out"].shape == (3, 4, 16)
    assert np.array_equal(decode["cu_seqlens_q"], [0, 1, 2, 3]) and np.array_equal(decode["seqused_k"], [7, 3, 10])
    # A dense cache is cut to the keys each sequence uses.
    assert dense_cache["k"].shape == (25, 2, 16) and np.array_equal(dense_cache["cu_seqlens_k"], [0, 12, 17, 25])
    for call in calls:
        args = {k[4:] for k in call["metadata"] if k.startswith("arg.")}
        assert not args & {"cu_seqlens_q", "cu_seqlens_k", "seqused_k", "block_table", "page_table"}, args


def test_the_reference_computes_what_each_op_computed(replayed):
    _, _, report, _ = replayed
    for name, call in zip(CALLS[:-1], report["calls"]):
        kernels = {k["kernel"]: k for k in call["kernels"]}
        assert kernels["model-output"]["error"]["rel_l2"] < 1e-6, (name, kernels["model-output"])
    assert report["calls"][2]["batching"] == ("a ragged batch of 3 sequences (queries 1..9, keys 4..9), "
                                              "paged (page size 4, 6 pages)")
    assert report["calls"][3]["sequences"] == {"q_lens": [1, 1, 1], "k_lens": [7, 3, 10]}
    assert report["calls"][0]["sequences"] == {"q_lens": Q_LENS, "k_lens": [7, 4, 9]}


def test_rows_of_a_sequence_with_too_few_keys_are_reported_apart(replayed):
    # seqused_k leaves the third sequence 2 keys for 9 queries: bottom-right, its first 7 rows see none.
    _, _, report, _ = replayed
    kernels = {k["kernel"]: k for k in report["calls"][1]["kernels"]}
    assert kernels["model-output"]["error"]["no_key_rows"] == 7 * 4


def test_torch_backends_replay_one_sequence_at_a_time(replayed):
    _, _, report, _ = replayed
    for name, call in zip(CALLS, report["calls"]):
        kernels = {k["kernel"]: k for k in call["kernels"]}
        for kernel in ("torch-math", "torch-flash-cpu"):
            if name == "window_softcap_used":
                assert kernels[kernel]["reason"] == "the call has a softcap of 20, which this kernel does not compute"
            elif name != "fa3_appended":
                assert kernels[kernel]["status"] == "not_verified", (name, kernels[kernel])
                assert kernels[kernel]["error"]["rel_l2"] < 1e-6, (name, kernel, kernels[kernel]["error"])


def pairs(q_len, k_len):
    """(query, key) pairs of a bottom-right causal sequence, the diagonal counted half."""
    return q_len * (2 * k_len - q_len) / 2 if q_len <= k_len else k_len * k_len / 2


def test_work_is_summed_over_sequences(replayed):
    _, _, report, _ = replayed
    decode = report["calls"][3]
    heads, heads_kv, dim, size = 4, 2, 16, 4
    k_lens = [7, 3, 10]
    assert decode["work"]["flops"] == sum(2 * heads * pairs(1, k) * 2 * dim for k in k_lens)
    # Q and O once, and the keys and values each sequence uses: not the pages stored.
    assert decode["work"]["bytes"] == size * (2 * 3 * heads * dim + 2 * sum(k_lens) * heads_kv * dim)


def test_keys_appended_to_a_cache_are_refused_by_name(replayed):
    _, _, report, _ = replayed
    appended = report["calls"][6]
    assert all(k["status"] == "not_supported" for k in appended["kernels"])
    reason = appended["kernels"][0]["reason"]
    assert "k_new=tensor Float [3,1,2,16] (keys appended to a KV cache)" in reason, reason


def test_a_ragged_capture_round_trips_through_pt(replayed, tmp_path):
    folder, _, report, _ = replayed
    capture = the_capture(folder / "caps")
    pts = f"{tmp_path}/pts/"
    run_attnreplay("convert", capture, pts, check=0)
    again = tmp_path / "again.json"
    run_attnreplay("run", pts, "--kernels", "reference", "--json", again, *FAST, check=0)
    errors = [{k["kernel"]: k.get("error", {}).get("rel_l2") for k in c["kernels"]}["model-output"]
              for c in load_json(again)["calls"][:6]]
    assert all(e is not None and e < 1e-6 for e in errors), errors


# Generated as FlashInfer's benchmark makes them (--routine), through the same record.

DECODE = ["--routine", "BatchDecodeWithPagedKVCacheWrapper", "--page_size", "16", "--batch_size", "5", "--s_qo", "1",
          "--s_kv", "200", "--num_qo_heads", "8", "--num_kv_heads", "2", "--head_dim_qk", "32", "--dtype", "fp32",
          "--random_actual_seq_len", "--seed", "11"]


def test_generated_paged_decode_counts_the_keys_each_sequence_reads(tmp_path):
    report = tmp_path / "decode.json"
    run_attnreplay("run", *DECODE, "--kernels", "reference,torch-math,torch-flash-cpu", "--json", report, *FAST,
                   check=0)
    call = load_json(report)["calls"][0]
    q_lens, k_lens = call["sequences"]["q_lens"], call["sequences"]["k_lens"]
    assert q_lens == [1] * 5 and all(1 <= k <= 200 for k in k_lens) and len(set(k_lens)) > 1, k_lens
    assert call["batching"].endswith(f"paged (page size 16, {sum((k + 15) // 16 for k in k_lens)} pages)")
    heads, heads_kv, dim = 8, 2, 32
    assert call["work"]["flops"] == sum(2 * heads * k * 2 * dim for k in k_lens)  # not causal: every key
    assert call["work"]["bytes"] == 4 * (2 * 5 * heads * dim + 2 * sum(k_lens) * heads_kv * dim)
    kernels = {k["kernel"]: k for k in call["kernels"]}
    for kernel in ("torch-math", "torch-flash-cpu"):
        assert kernels[kernel]["status"] == "not_verified" and kernels[kernel]["error"]["rel_l2"] < 1e-6, kernels[kernel]
    # The rerun command regenerates the same batch.
    rerun = kernels["torch-math"]["rerun"]
    assert "--routine BatchDecodeWithPagedKVCacheWrapper --page_size 16 --random_actual_seq_len" in rerun, rerun
    again = tmp_path / "again.json"
    run_attnreplay(*rerun.split()[1:], "--json", again, check=0)  # the rerun carries the timing flags
    assert load_json(again)["calls"][0]["sequences"] == call["sequences"]


def test_generated_ragged_prefill_replays_sequence_by_sequence(tmp_path):
    report = tmp_path / "prefill.json"
    saved = tmp_path / "prefill.h5"
    run_attnreplay("run", "--routine", "BatchPrefillWithRaggedKVCacheWrapper", "--batch_size", "4", "--s_qo", "48",
                   "--s_kv", "64", "--num_qo_heads", "4", "--num_kv_heads", "4", "--head_dim_qk", "16", "--causal",
                   "--dtype", "fp32", "--random_actual_seq_len", "--kernels", "reference,torch-math",
                   "--save-inputs", saved, "--json", report, *FAST, check=0)
    call = load_json(report)["calls"][0]
    q_lens, k_lens = call["sequences"]["q_lens"], call["sequences"]["k_lens"]
    assert all(1 <= q <= min(48, k) for q, k in zip(q_lens, k_lens)), (q_lens, k_lens)
    assert call["work"]["flops"] == sum(2 * 4 * pairs(q, k) * 2 * 16 for q, k in zip(q_lens, k_lens))
    math = {k["kernel"]: k for k in call["kernels"]}["torch-math"]
    assert math["error"]["rel_l2"] < 1e-6, math
    # The saved call is the same ragged batch.
    [stored] = read_calls(saved)
    assert stored["layout"] == "thd" and stored["block_table"] is None
    assert np.array_equal(np.diff(stored["cu_seqlens_q"]), q_lens) and np.array_equal(np.diff(stored["cu_seqlens_k"]), k_lens)


@pytest.mark.parametrize("flags, message", [
    (["--routine", "BatchDecodeWithPagedKVCacheWrapper", "--s_qo", "1"], "--page_size: BatchDecodeWithPagedKVCacheWrapper needs a page size"),
    (["--routine", "BatchDecodeWithPagedKVCacheWrapper", "--page_size", "16", "--s_qo", "4"],
     "--s_qo: BatchDecodeWithPagedKVCacheWrapper decodes one query per sequence, got 4"),
    (["--routine", "BatchPrefillWithRaggedKVCacheWrapper", "--page_size", "16", "--s_qo", "4"],
     "--page_size: BatchPrefillWithRaggedKVCacheWrapper has no pages"),
    (["--routine", "BatchDecode", "--s_qo", "1"], "--routine: BatchDecode not in {BatchPrefillWithRaggedKVCacheWrapper"),
    (["--s_qo", "4", "--page_size", "16"], "--page_size: only a --routine generates sequences"),
])
def test_bad_routine_flags_are_named(flags, message):
    result = run_attnreplay("run", *flags, "--kernels", "reference")
    assert result.returncode != 0 and message in result.stderr, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and "terminate" not in result.stderr


def test_plugins_take_a_ragged_batch_as_one(replayed, tmp_path):
    # A plug-in of layout "thd" gets the packed rows and the offsets (a paged batch's keys gathered,
    # or with `paged` the pages and block table), and returns the packed output.
    folder, _, _, _ = replayed
    report = tmp_path / "plugins.json"
    run_attnreplay("run", the_capture(folder / "caps"), "--kernel-module", PLUGINS, "--kernels",
                   "varlen-rows,paged-rows", "--json", report, *FAST, check=0)
    calls = load_json(report)["calls"]
    for name, call in zip(CALLS, calls):
        kernels = {k["kernel"]: k for k in call["kernels"]}
        rows, paged = kernels["varlen-rows"], kernels["paged-rows"]
        if name in ("window_softcap_used", "fa3_varlen_window"):
            assert rows["status"] == "not_supported" and "which this kernel does not compute" in rows["reason"], rows
        elif name != "fa3_appended":
            assert rows["status"] == "not_verified" and rows["error"]["rel_l2"] < 1e-6, (name, rows)
        if name in ("paged", "fa3_paged_decode"):
            assert paged["status"] == "not_verified" and paged["error"]["rel_l2"] < 1e-6, (name, paged)
        elif name in ("varlen", "fa3_dense_cache"):
            assert paged["status"] == "not_supported" and paged["reason"] == "takes paged batches", paged


# The adapters that take a ragged or paged batch as one (docs/adapters.md), through attnreplay's own
# path (the call's offsets, block table and pages handed over, the output checked and judged), against
# their libraries' stand-ins on the CPU.

RAGGED_ADAPTERS = ["flashinfer-decode-on-cpu", "flashinfer-batch-prefill-on-cpu", "flash-attn-4-varlen-on-cpu"]


def run_ragged_adapters(tmp_path, *flags):
    """Each call's sequences and its rows of the ragged adapters, by kernel."""
    report = tmp_path / "adapters.json"
    run_attnreplay("run", *flags, "--kernel-module", ADAPTERS_ON_CPU, "--kernels", ",".join(RAGGED_ADAPTERS),
                   "--json", report, *FAST, env={**os.environ, "PYTHONPATH": STAND_INS}, check=0)
    calls = load_json(report)["calls"]
    for call in calls:
        call["rows"] = {row["kernel"]: row for row in call["kernels"] if row["kernel"] != "model-output"}
        assert sorted(call["rows"]) == sorted(RAGGED_ADAPTERS), sorted(call["rows"])
    return calls


def assert_judged_close(row, bound=1e-2):
    assert row["status"] == "not_verified" and row["error"]["rel_l2"] < bound, row


BATCH = ["--batch_size", "5", "--num_qo_heads", "8", "--num_kv_heads", "2", "--head_dim_qk", "64", "--dtype", "bf16",
         "--random_actual_seq_len", "--seed", "5"]


@pytest.mark.parametrize("page_size", ["1", "16"])
def test_library_adapters_take_a_generated_paged_decode(tmp_path, page_size):
    [call] = run_ragged_adapters(tmp_path, "--routine", "BatchDecodeWithPagedKVCacheWrapper", "--page_size", page_size,
                                 "--s_qo", "1", "--s_kv", "100", *BATCH)
    assert len(set(call["sequences"]["k_lens"])) > 1, call["sequences"]
    for row in call["rows"].values():
        assert_judged_close(row)


@pytest.mark.parametrize("routine", ["BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper"])
def test_library_adapters_take_a_generated_causal_prefill(tmp_path, routine):
    pages = ["--page_size", "16"] if "Paged" in routine else []
    [call] = run_ragged_adapters(tmp_path, "--routine", routine, *pages, "--s_qo", "40", "--s_kv", "90", "--causal",
                                 *BATCH)
    rows = call["rows"]
    assert_judged_close(rows["flashinfer-batch-prefill-on-cpu"])
    assert_judged_close(rows["flash-attn-4-varlen-on-cpu"])
    decode = rows["flashinfer-decode-on-cpu"]
    assert decode["status"] == "not_supported" and "BatchDecodeWithPagedKVCacheWrapper decodes one query row a " \
        "sequence" in decode["reason"], decode


def ragged_extension_call(path, *, causal, window_left, window_right, softcap):
    """A packed thd call in bf16 (docs/format.md) with the window and softcap given, bottom-right as
    flash-attn's varlen ops record them: the capture's lengths (its own calls are fp32 with head dim
    16, which the libraries do not take)."""
    import torch

    g = torch.Generator().manual_seed(7)
    q_lens, k_lens = [5, 1, 9], [7, 4, 9]
    q = torch.randn(sum(q_lens), 8, 64, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(sum(k_lens), 2, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    torch.save({"format": "attnreplay.call", "schema_version": 2, "call_index": 0, "op": "test::varlen_window",
                "backend": "", "layout": "thd", "is_causal": causal, "causal_alignment": "bottom_right",
                "scale": 0.125, "dropout_p": 0.0, "enable_gqa": True, "window_left": window_left,
                "window_right": window_right, "softcap": softcap, "q": q, "k": k, "v": v, "mask": None, "out": None,
                "cu_seqlens_q": torch.tensor([0, 5, 6, 15], dtype=torch.int32),
                "cu_seqlens_k": torch.tensor([0, 7, 11, 20], dtype=torch.int32), "metadata": {}}, path)
    return path


def test_library_adapters_take_windows_and_softcaps_within_each_sequence(tmp_path):
    # The capture's two windowed calls' arguments: flash-attn 2's (3, 0) causal with softcap 20, and
    # FlashAttention-3's (2, 1) without causality, which FlashInfer (a left window only) declines.
    causal = run_ragged_adapters(tmp_path, ragged_extension_call(tmp_path / "causal.pt", causal=True, window_left=3,
                                                                  window_right=0, softcap=20.0))[0]["rows"]
    for name in ("flashinfer-batch-prefill-on-cpu", "flash-attn-4-varlen-on-cpu"):
        assert_judged_close(causal[name])
    assert "decodes one query row a sequence" in causal["flashinfer-decode-on-cpu"]["reason"]
    both_sides = run_ragged_adapters(tmp_path, ragged_extension_call(tmp_path / "both.pt", causal=False,
                                                                      window_left=2, window_right=1,
                                                                      softcap=0.0))[0]["rows"]
    assert_judged_close(both_sides["flash-attn-4-varlen-on-cpu"])
    prefill = both_sides["flashinfer-batch-prefill-on-cpu"]
    assert prefill["status"] == "not_supported" and "FlashInfer takes a left window only" in prefill["reason"], prefill