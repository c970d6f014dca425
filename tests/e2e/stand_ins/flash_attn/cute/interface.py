"""Test stand-in for FlashAttention-4's `flash_attn.cute.interface`, not the library:
`flash_attn_func` with FA4's signature and conventions, computed with torch in float64 on the CPU.

Conventions followed (flash_attn/cute/interface.py, mask.py): q (batch, seq_q, heads, head_dim), k
(batch, seq_kv, heads_kv, head_dim), v (batch, seq_kv, heads_kv, head_dim_v); fp16 or bf16, one dtype;
head dims multiples of 8 within [8, 256] (its sm90 rule); causal aligned to the bottom right; returns
(out, lse), lse None unless return_lse. The CuTe-DSL hooks (score_mod, mask_mod, ...) and the other
options are not emulated and raise. The last call's arguments are in LAST_CALL.
"""
import torch

from _stand_in_math import attention_fp64, causal_visible
from _stand_in_record import record

LAST_CALL = {}


def flash_attn_func(q, k, v, qv=None, gather_kv_indices=None, softmax_scale=None, causal=False,
                    window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None,
                    deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None, aux_tensors=None,
                    aux_scalars=None, block_sparse_tensors=None, block_sparse_tensors_bwd=None, return_lse=False):
    record(LAST_CALL, locals(), tensors=("q", "k", "v"))
    if v.dtype not in (torch.float16, torch.bfloat16):
        raise AssertionError("the stand-in takes fp16 and bf16 inputs")
    if q.dtype != v.dtype or k.dtype != v.dtype:
        raise AssertionError("q, k, v, and qv must have the same dtype")
    batch, seq_q, heads, head_dim = q.shape
    _, seq_kv, heads_kv, head_dim_v = v.shape
    if tuple(k.shape) != (batch, seq_kv, heads_kv, head_dim):
        raise AssertionError(f"k must be {(batch, seq_kv, heads_kv, head_dim)}, got {tuple(k.shape)}")
    if heads % heads_kv:
        raise AssertionError("num_head must be divisible by num_head_kv")
    if not (8 <= head_dim <= 256 and 8 <= head_dim_v <= 256) or head_dim % 8 or head_dim_v % 8:
        raise AssertionError(f"(head_dim, head_dim_v)=({head_dim}, {head_dim_v}) is not supported on SM90.")
    if (qv is not None or gather_kv_indices is not None or window_size != (None, None) or learnable_sink is not None
            or softcap or score_mod is not None or mask_mod is not None or block_sparse_tensors is not None):
        raise NotImplementedError("the stand-in does not emulate FA4's options beyond scale and causal")
    if softmax_scale is None:
        softmax_scale = head_dim ** -0.5
    visible = causal_visible(seq_q, seq_kv, seq_kv - seq_q) if causal else None
    out = attention_fp64(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale, visible)
    return out.to(q.dtype).transpose(1, 2), None
