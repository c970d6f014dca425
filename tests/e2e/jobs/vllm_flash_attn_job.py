"""vLLM's builds of flash-attn as the dispatcher sees them, on the CPU: stand-ins registered under
vllm-flash-attn's own names and schemas, called as vllm_flash_attn's interface calls them.

- fa2_paged: _vllm_fa2_C::varlen_fwd as vLLM's FlashAttention backend calls it, packed queries over
  a paged cache with seqused_k, cu_seqlens_k an uninitialised placeholder (the schema wants one),
  `out` given, a sliding window and a softcap;
- fa2_kvcache_decode: _vllm_fa2_C::fwd_kvcache, one query a sequence over a paged cache
  (kcache, vcache) with seqlens_k;
- fa2_kvcache_appended: the same appending k and v to a dense cache, which the record cannot hold;
- fa3_sinks: _vllm_fa3_C::fwd with s_aux (gpt-oss's sinks) and context parallelism off.

--save writes every output."""
import argparse

import numpy as np
import torch

from flash_attn_math import fa3_fwd, offsets, varlen

FA2 = torch.library.Library("_vllm_fa2_C", "DEF")
FA2.define(
    "varlen_fwd(Tensor! q, Tensor k, Tensor v, Tensor!? out, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
    "Tensor? seqused_k, Tensor? leftpad_k, Tensor? block_table, Tensor? alibi_slopes, int max_seqlen_q, "
    "int max_seqlen_k, float p_dropout, float softmax_scale, bool zero_tensors, bool is_causal, "
    "int window_size_left, int window_size_right, float softcap, bool return_softmax, Generator? gen) -> Tensor[]")
FA2.define(
    "fwd_kvcache(Tensor! q, Tensor kcache, Tensor vcache, Tensor? k, Tensor? v, Tensor? seqlens_k, "
    "Tensor? rotary_cos, Tensor? rotary_sin, Tensor? cache_batch_idx, Tensor? leftpad_k, Tensor? block_table, "
    "Tensor? alibi_slopes, Tensor!? out, float softmax_scale, bool is_causal, int window_size_left, "
    "int window_size_right, float softcap, bool is_rotary_interleaved, int num_splits) -> Tensor[]")
FA3 = torch.library.Library("_vllm_fa3_C", "DEF")
FA3.define(
    "fwd(Tensor! q, Tensor k, Tensor v, Tensor? k_new, Tensor? v_new, Tensor? q_v, Tensor!? out, "
    "Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, Tensor? cu_seqlens_k_new, Tensor? seqused_q, Tensor? seqused_k, "
    "int? max_seqlen_q, int? max_seqlen_k, Tensor? page_table, Tensor? kv_batch_idx, Tensor? leftpad_k, "
    "Tensor? rotary_cos, Tensor? rotary_sin, Tensor? seqlens_rotary, Tensor? q_descale, Tensor? k_descale, "
    "Tensor? v_descale, float softmax_scale, bool is_causal, int window_size_left, int window_size_right, "
    "float softcap, bool is_rotary_interleaved, Tensor? scheduler_metadata, int num_splits, bool? pack_gqa, "
    "int sm_margin, Tensor? s_aux, int cp_world_size, int cp_rank, Tensor? cp_tot_seqused_k) -> Tensor[]")


def varlen_fwd(q, k, v, out, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k, block_table, alibi_slopes,
               max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale, zero_tensors, is_causal, window_size_left,
               window_size_right, softcap, return_softmax, gen):
    result = varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, softmax_scale, is_causal,
                    window_size_left, window_size_right, softcap, alibi_slopes)
    if out is not None:
        out.copy_(result)
        result = out
    return [result, q.new_empty(q.shape[1], q.shape[0])]


def fwd_kvcache(q, kcache, vcache, k, v, seqlens_k, rotary_cos, rotary_sin, cache_batch_idx, leftpad_k, block_table,
                alibi_slopes, out, softmax_scale, is_causal, window_size_left, window_size_right, softcap,
                is_rotary_interleaved, num_splits):
    result, *_ = fa3_fwd(q, kcache, vcache, k_new=k, v_new=v, seqused_k=seqlens_k, page_table=block_table,
                         softmax_scale=softmax_scale, is_causal=is_causal, window_size_left=window_size_left,
                         window_size_right=window_size_right, softcap=softcap)
    return [result, q.new_empty(0)]


def fa3_vllm_fwd(*args):
    *fa3_args, s_aux, cp_world_size, cp_rank, cp_tot_seqused_k = args
    result, *_ = fa3_fwd(*fa3_args[:27], 0, *fa3_args[27:], sinks=s_aux)  # attention_chunk 0: not in this schema
    return [result, result.new_empty(0)]


FA2.impl("varlen_fwd", varlen_fwd, "CPU")
FA2.impl("fwd_kvcache", fwd_kvcache, "CPU")
FA3.impl("fwd", fa3_vllm_fwd, "CPU")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", required=True)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    heads, heads_kv, dim = 4, 2, 16
    scale = dim ** -0.5
    pages_k, pages_v = (torch.randn(10, 4, heads_kv, dim, generator=g) for _ in range(2))
    table = torch.tensor([[6, 1, 3], [8, 0, 0], [2, 9, 5]], dtype=torch.int32)
    used = torch.tensor([11, 3, 9], dtype=torch.int32)
    q_lens = [4, 1, 2]
    cu_q = offsets(q_lens)
    q = torch.randn(sum(q_lens), heads, dim, generator=g)
    ops2, ops3 = torch.ops._vllm_fa2_C, torch.ops._vllm_fa3_C
    outs = {}

    out = torch.empty_like(q)
    ops2.varlen_fwd(q, pages_k, pages_v, out, cu_q, torch.empty_like(cu_q), used, None, table, None, 4, 11, 0.0, scale,
                    False, True, 6, 0, 25.0, False, None)
    outs["fa2_paged"] = out

    decode_q = torch.randn(3, 1, heads, dim, generator=g)
    outs["fa2_kvcache_decode"] = ops2.fwd_kvcache(decode_q, pages_k, pages_v, None, None, used, None, None, None, None,
                                                  table, None, None, scale, True, -1, -1, 0.0, False, 0)[0]
    dense_k, dense_v = (torch.randn(3, 8, heads_kv, dim, generator=g) for _ in range(2))
    new_k, new_v = (torch.randn(3, 1, heads_kv, dim, generator=g) for _ in range(2))
    outs["fa2_kvcache_appended"] = ops2.fwd_kvcache(
        decode_q, dense_k, dense_v, new_k, new_v, torch.tensor([2, 5, 7], dtype=torch.int32), None, None, None, None,
        None, None, None, scale, True, -1, -1, 0.0, False, 0)[0]

    outs["fa3_sinks"] = ops3.fwd(
        q, pages_k, pages_v, None, None, None, None, cu_q, None, None, None, used, 4, None, table, None, None, None,
        None, None, None, None, None, scale, True, -1, -1, 0.0, False, None, 0, None, 0,
        torch.randn(heads, generator=g), 1, 0, None)[0]
    np.savez(args.save, **{name: t.numpy() for name, t in outs.items()})


if __name__ == "__main__":
    main()
