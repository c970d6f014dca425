"""Attention entry points that are Python functions, not dispatcher ops, called as an LLM server
calls them: FlashInfer's batch wrappers (plan once, run) and single-request functions, and
flash-attn 2's flash_attn_with_kvcache, and FlashInfer's MLA wrapper, from the stand-ins of tests/e2e/stand_ins (which follow
those libraries' signatures and compute in fp64 on the CPU). Nothing here knows about capture.

Each call's output is saved (--save) under its name, in call order. The paged prefill's plan
buffers are overwritten after plan, as servers reuse theirs; the cache pages are dealt in a shuffled
order; the last call asks for fp16 Q·K accumulation, which the record cannot represent. --device cuda
puts every tensor, page lists included, on the GPU."""
import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stand_ins"))
import flashinfer  # noqa: E402
from flash_attn import flash_attn_with_kvcache  # noqa: E402

HEADS, HEADS_KV, DIM, PAGE = 4, 2, 16, 4
DTYPE = torch.float16
DEVICE = "cpu"  # --device


def paged(k_lens, pages_total=16, seed=0):
    """A cache of pages_total pages and FlashInfer's page lists for sequences of k_lens keys."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(pages_total, generator=generator).to(torch.int32)
    counts = [(n + PAGE - 1) // PAGE for n in k_lens]
    indptr = torch.tensor([0] + counts, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    indices = order[:int(indptr[-1])].clone()
    last = torch.tensor([n - (c - 1) * PAGE for n, c in zip(k_lens, counts)], dtype=torch.int32)
    k = torch.randn(pages_total, PAGE, HEADS_KV, DIM, generator=generator).to(DEVICE, DTYPE)
    v = torch.randn(pages_total, PAGE, HEADS_KV, DIM, generator=generator).to(DEVICE, DTYPE)
    return k, v, indptr.to(DEVICE), indices.to(DEVICE), last.to(DEVICE)


def offsets(lengths):
    return torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(DEVICE)


def rows(count, heads=HEADS, seed=1):
    return torch.randn(count, heads, DIM, generator=torch.Generator().manual_seed(seed)).to(DEVICE, DTYPE)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", required=True)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    outputs = {}
    workspace = torch.empty(1024, dtype=torch.uint8, device=DEVICE)

    k, v, indptr, indices, last = paged([7, 3, 10])
    decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace)
    decode.plan(indptr, indices, last, HEADS, HEADS_KV, DIM, PAGE, logits_soft_cap=30.0, sm_scale=0.3)
    outputs["decode_softcap"] = decode.run(rows(3), (k, v))

    hnd = torch.stack([k, v], dim=1).transpose(2, 3).contiguous()  # (pages, 2, heads_kv, page, dim)
    decode_hnd = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout="HND")
    decode_hnd.plan(indptr, indices, last, HEADS, HEADS_KV, DIM, PAGE)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], device=DEVICE)
    outputs["decode_hnd_window_sinks"] = decode_hnd.run(rows(3, seed=2), hnd, window_left=4, sinks=sinks)

    q_lens, k_lens = [5, 1, 3], [7, 4, 9]
    k, v, indptr, indices, last = paged(k_lens, seed=3)
    qo_indptr = offsets(q_lens)
    prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace)
    prefill.plan(qo_indptr, indptr, indices, last, HEADS, HEADS_KV, DIM, PAGE, causal=True)
    for buffer in (qo_indptr, indptr, indices, last):
        buffer.zero_()  # the server refills its buffers for the next step
    outputs["prefill_paged_causal"] = prefill.run(rows(sum(q_lens), seed=4), (k, v))

    ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace)
    ragged.plan(offsets(q_lens), offsets(k_lens), HEADS, HEADS_KV, DIM, causal=True, window_left=3)
    outputs["prefill_ragged_window"] = ragged.run(rows(sum(q_lens), seed=5), rows(sum(k_lens), HEADS_KV, seed=6),
                                                  rows(sum(k_lens), HEADS_KV, seed=7))

    outputs["single_prefill"] = flashinfer.single_prefill_with_kv_cache(rows(6, seed=8), rows(9, HEADS_KV, seed=9),
                                                                        rows(9, HEADS_KV, seed=10), causal=True)
    outputs["single_decode"] = flashinfer.single_decode_with_kv_cache(rows(1, seed=11)[0], rows(9, HEADS_KV, seed=12),
                                                                      rows(9, HEADS_KV, seed=13))

    generator = torch.Generator().manual_seed(14)
    k_cache, v_cache, new_k, new_v = (torch.randn(2, n, HEADS_KV, DIM, generator=generator).to(DEVICE, DTYPE)
                                      for n in (12, 12, 2, 2))
    q = torch.randn(2, 2, HEADS, DIM, generator=generator).to(DEVICE, DTYPE)
    outputs["kvcache_appended"] = flash_attn_with_kvcache(
        q, k_cache, v_cache, new_k, new_v, cache_seqlens=torch.tensor([5, 8], dtype=torch.int32, device=DEVICE),
        causal=True)

    k, v, indptr, indices, last = paged([6, 9], seed=15)
    table = torch.full((2, 3), 0, dtype=torch.int32, device=DEVICE)
    table[0, :2], table[1, :3] = indices[:2], indices[2:5]
    q = torch.randn(2, 1, HEADS, DIM, generator=generator).to(DEVICE, DTYPE)
    outputs["kvcache_paged_window"] = flash_attn_with_kvcache(
        q, k, v, cache_seqlens=torch.tensor([6, 9], dtype=torch.int32, device=DEVICE), block_table=table,
        window_size=(2, -1),
        softcap=10.0)

    # DeepSeek's MLA, absorbed: 4 query heads of [32 compressed, 8 rope] channels over one shared
    # key head, incremental prefill over pages of 4 tokens dealt out of 12.
    generator = torch.Generator().manual_seed(18)
    ckv, kpe = (torch.randn(12, PAGE, n, generator=generator).to(DEVICE, DTYPE) for n in (32, 8))
    mla_q_lens, mla_kv_lens = [2, 1, 3], [6, 9, 5]
    page_counts = [(n + PAGE - 1) // PAGE for n in mla_kv_lens]
    mla_pages = torch.randperm(12, generator=generator)[:sum(page_counts)].to(DEVICE, torch.int32)
    q_nope, q_pe = (torch.randn(sum(mla_q_lens), HEADS, n, generator=generator).to(DEVICE, DTYPE) for n in (32, 8))
    mla = flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace)
    mla.plan(offsets(mla_q_lens), offsets(page_counts), mla_pages,
             torch.tensor(mla_kv_lens, dtype=torch.int32, device=DEVICE), HEADS, 32, 8, PAGE, True, 0.2, DTYPE, DTYPE)
    outputs["mla_paged_causal"] = mla.run(q_nope, q_pe, ckv, kpe)

    k, v, indptr, indices, last = paged(k_lens, seed=16)
    flagged = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace)
    flagged.plan(offsets(q_lens), indptr, indices, last, HEADS, HEADS_KV, DIM, PAGE, use_fp16_qk_reduction=True)
    outputs["fp16_qk_reduction"] = flagged.run(rows(sum(q_lens), seed=17), (k, v))

    np.savez(args.save, **{name: out.float().cpu().numpy() for name, out in outputs.items()})


if __name__ == "__main__":
    main()
