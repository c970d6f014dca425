"""Ragged and paged attention as the dispatcher sees it, on the CPU: torch.library custom ops
registered under flash-attn's own names and schemas, computing what flash-attn computes with plain
torch ops, sequence by sequence.

- flash_attn::_flash_attn_varlen_forward (flash-attn 2.8): q (total_q, heads, dim) packed by
  cu_seqlens_q; k and v packed by cu_seqlens_k, or pages (pages, page_size, heads_kv, dim) listed
  by block_table; seqused_k limits each sequence's keys.
- flash_attn_3::fwd (FlashAttention-3's one forward op): the same, a dense (batch, seq, heads, dim)
  query over a paged cache (page_table) or a dense cache with seqused_k, and k_new (keys appended
  to the cache), which the record cannot hold.

Causality and windows align bottom-right within each sequence, as flash-attn does; a row that sees
no key is 0. --save writes every output."""
import argparse
from typing import Optional

import numpy as np
import torch

from flash_attn_math import fa3_fwd, varlen


@torch.library.custom_op("flash_attn::_flash_attn_varlen_forward", mutates_args=(), device_types="cpu")
def _flash_attn_varlen_forward(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
        max_seqlen_q: int, max_seqlen_k: int, dropout_p: float, softmax_scale: float, causal: bool,
        window_size_left: int = -1, window_size_right: int = -1, softcap: float = 0.0,
        alibi_slopes: Optional[torch.Tensor] = None, return_softmax: bool = False,
        block_table: Optional[torch.Tensor] = None, leftpad_k: Optional[torch.Tensor] = None,
        seqused_k: Optional[torch.Tensor] = None, zero_tensors: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    out = varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, softmax_scale, causal,
                 window_size_left, window_size_right, softcap, alibi_slopes)
    return out, q.new_empty(q.shape[1], q.shape[0]), q.new_empty(0), torch.empty(2, dtype=torch.int64)


@_flash_attn_varlen_forward.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
      window_size_left=-1, window_size_right=-1, softcap=0.0, alibi_slopes=None, return_softmax=False,
      block_table=None, leftpad_k=None, seqused_k=None, zero_tensors=False):
    return torch.empty_like(q), q.new_empty(q.shape[1], q.shape[0]), q.new_empty(0), q.new_empty(2, dtype=torch.int64)


# FlashAttention-3's schema (hopper/flash_api.cpp), registered as its extension does.
FA3 = torch.library.Library("flash_attn_3", "DEF")
FA3.define(
    "fwd(Tensor q, Tensor k, Tensor v, Tensor(k_new!)? k_new=None, Tensor(v_new!)? v_new=None, Tensor? q_v=None, "
    "Tensor(out!)? out=None, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, Tensor? cu_seqlens_k_new=None, "
    "Tensor? seqused_q=None, Tensor? seqused_k=None, int? max_seqlen_q=None, int? max_seqlen_k=None, "
    "Tensor? page_table=None, Tensor? kv_batch_idx=None, Tensor? leftpad_k=None, Tensor? rotary_cos=None, "
    "Tensor? rotary_sin=None, Tensor? seqlens_rotary=None, Tensor? q_descale=None, Tensor? k_descale=None, "
    "Tensor? v_descale=None, float? softmax_scale=None, bool is_causal=False, int window_size_left=-1, "
    "int window_size_right=-1, int attention_chunk=0, float softcap=0.0, bool is_rotary_interleaved=False, "
    "Tensor? scheduler_metadata=None, int num_splits=0, bool? pack_gqa=None, int sm_margin=0) "
    "-> (Tensor(out!), Tensor, Tensor, Tensor)")


FA3.impl("fwd", fa3_fwd, "CPU")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", required=True)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    heads, heads_kv, dim = 4, 2, 16
    scale = dim ** -0.5
    q_lens, k_lens = [5, 1, 9], [7, 4, 9]
    q = torch.randn(sum(q_lens), heads, dim, generator=g)
    k, v = (torch.randn(sum(k_lens), heads_kv, dim, generator=g) for _ in range(2))
    cu_q = torch.tensor([0, 5, 6, 15], dtype=torch.int32)
    cu_k = torch.tensor([0, 7, 11, 20], dtype=torch.int32)
    # A cache of 16 pages of 4 tokens; the three sequences hold pages (3, 9), (0,) and (12, 5, 14).
    cache_k, cache_v = (torch.randn(16, 4, heads_kv, dim, generator=g) for _ in range(2))
    table = torch.tensor([[3, 9, 0], [0, 1, 1], [12, 5, 14]], dtype=torch.int32)
    varlen_forward = torch.ops.flash_attn._flash_attn_varlen_forward
    fa3 = torch.ops.flash_attn_3.fwd
    decode_q = torch.randn(3, 1, heads, dim, generator=g)
    dense_k, dense_v = (torch.randn(3, 12, heads_kv, dim, generator=g) for _ in range(2))
    outs = {
        "varlen": varlen_forward(q, k, v, cu_q, cu_k, 9, 9, 0.0, scale, True)[0],
        "window_softcap_used": varlen_forward(q, k, v, cu_q, cu_k, 9, 9, 0.0, scale, True, 3, 0, 20.0,
                                              seqused_k=torch.tensor([6, 4, 2], dtype=torch.int32))[0],
        "paged": varlen_forward(q, cache_k, cache_v, cu_q, cu_k, 9, 9, 0.0, scale, True, block_table=table)[0],
        "fa3_paged_decode": fa3(decode_q, cache_k, cache_v, page_table=table,
                                seqused_k=torch.tensor([7, 3, 10], dtype=torch.int32), softmax_scale=scale,
                                is_causal=True)[0],
        "fa3_varlen_window": fa3(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=9, max_seqlen_k=9,
                                 softmax_scale=scale, window_size_left=2, window_size_right=1)[0],
        "fa3_dense_cache": fa3(decode_q, dense_k, dense_v, seqused_k=torch.tensor([12, 5, 8], dtype=torch.int32),
                               is_causal=True)[0],
        "fa3_appended": fa3(decode_q, dense_k, dense_v, k_new=torch.randn(3, 1, heads_kv, dim, generator=g),
                            v_new=torch.randn(3, 1, heads_kv, dim, generator=g),
                            seqused_k=torch.tensor([4, 5, 6], dtype=torch.int32), is_causal=True)[0],
    }
    np.savez(args.save, **{name: t.numpy() for name, t in outs.items()})


if __name__ == "__main__":
    main()
