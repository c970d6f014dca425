"""SGLang's FlashAttention-3 backend as the dispatcher sees it, on the CPU: a stand-in registered
under sgl-kernel's own name and schema (sgl_kernel::fwd, its build of FlashAttention-3's forward
op, with sinks), called as sgl_kernel.flash_attn.flash_attn_with_kvcache calls it: every argument
positional, the KV cache written beforehand and read through a page table.

- extend: a prefill over cached prefixes, page size 1 (SGLang's default: the page table is the
  request-to-token map), cu_seqlens_k_new given as SGLang gives it, without k_new;
- decode_window_softcap: one query a request over pages of 4, a sliding window and a softcap;
- decode_sinks: the same with attention sinks (gpt-oss);
- appended: k_new and v_new appended to a dense cache, which the record cannot hold.

--save writes every output."""
import argparse

import numpy as np
import torch

from flash_attn_math import fa3_fwd, offsets

# sgl-kernel's registration (sgl-kernel/csrc/flash_extension.cc): no defaults, q marked mutable.
SGL_KERNEL = torch.library.Library("sgl_kernel", "FRAGMENT")
SGL_KERNEL.define(
    "fwd(Tensor! q, Tensor k, Tensor v, Tensor? k_new, Tensor? v_new, Tensor? q_v, Tensor? out, "
    "Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, Tensor? cu_seqlens_k_new, Tensor? seqused_q, Tensor? seqused_k, "
    "int? max_seqlen_q, int? max_seqlen_k, Tensor? page_table, Tensor? kv_batch_idx, Tensor? leftpad_k, "
    "Tensor? rotary_cos, Tensor? rotary_sin, Tensor? seqlens_rotary, Tensor? q_descale, Tensor? k_descale, "
    "Tensor? v_descale, float? softmax_scale, bool is_causal, int window_size_left, int window_size_right, "
    "int attention_chunk, float softcap, bool is_rotary_interleaved, Tensor? scheduler_metadata, int num_splits, "
    "bool? pack_gqa, int sm_margin, Tensor? sinks) -> (Tensor, Tensor, Tensor, Tensor)")
SGL_KERNEL.impl("fwd", fa3_fwd, "CPU")


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, page_table=None,
                            cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0, sinks=None):
    """As sgl_kernel.flash_attn's wrapper hands its arguments to the op."""
    out, *_ = torch.ops.sgl_kernel.fwd.default(
        q, k_cache, v_cache, k, v, None, None, cu_seqlens_q, None, cu_seqlens_k_new, None, cache_seqlens,
        max_seqlen_q, None, page_table, None, None, None, None, None, None, None, None, softmax_scale, causal,
        window_size[0], window_size[1], 0, softcap, False, None, 0, None, 0, sinks)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", required=True)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    heads, heads_kv, dim = 4, 2, 16
    scale = dim ** -0.5
    outs = {}

    # extend: token slots of a 40-slot pool, page size 1; each request's prefix is cached already.
    q_lens, prefix = [3, 1, 6], [4, 5, 0]
    seqlens = [p + n for p, n in zip(prefix, q_lens)]
    slots_k, slots_v = (torch.randn(40, 1, heads_kv, dim, generator=g) for _ in range(2))
    slots = torch.randperm(40, generator=g)[:sum(seqlens)].to(torch.int32)
    table = torch.full((3, max(seqlens)), 0, dtype=torch.int32)
    for b, (first, n) in enumerate(zip(offsets(seqlens)[:-1].tolist(), seqlens)):
        table[b, :n] = slots[first:first + n]
    q = torch.randn(sum(q_lens), heads, dim, generator=g)
    outs["extend"] = flash_attn_with_kvcache(
        q, slots_k, slots_v, cache_seqlens=torch.tensor(seqlens, dtype=torch.int32), page_table=table,
        cu_seqlens_q=offsets(q_lens), cu_seqlens_k_new=offsets(seqlens), max_seqlen_q=max(q_lens),
        softmax_scale=scale, causal=True)

    # decode: 12 pages of 4 tokens, one query a request.
    pages_k, pages_v = (torch.randn(12, 4, heads_kv, dim, generator=g) for _ in range(2))
    pages = torch.tensor([[7, 2, 9], [0, 11, 0], [4, 5, 6]], dtype=torch.int32)
    used = torch.tensor([10, 6, 12], dtype=torch.int32)
    decode_q = torch.randn(3, heads, dim, generator=g)
    decode = dict(cache_seqlens=used, page_table=pages, cu_seqlens_q=offsets([1, 1, 1]), max_seqlen_q=1,
                  softmax_scale=scale, causal=True)
    outs["decode_window_softcap"] = flash_attn_with_kvcache(decode_q, pages_k, pages_v, window_size=(5, 0),
                                                            softcap=30.0, **decode)
    outs["decode_sinks"] = flash_attn_with_kvcache(decode_q, pages_k, pages_v,
                                                   sinks=torch.randn(heads, generator=g), **decode)

    # appended: keys and values written into a dense cache by the op itself.
    dense_k, dense_v = (torch.randn(3, 8, heads_kv, dim, generator=g) for _ in range(2))
    outs["appended"] = flash_attn_with_kvcache(
        decode_q.unsqueeze(1), dense_k, dense_v, k=torch.randn(3, 1, heads_kv, dim, generator=g),
        v=torch.randn(3, 1, heads_kv, dim, generator=g), cache_seqlens=torch.tensor([3, 5, 7], dtype=torch.int32),
        causal=True)
    np.savez(args.save, **{name: t.numpy() for name, t in outs.items()})


if __name__ == "__main__":
    main()
