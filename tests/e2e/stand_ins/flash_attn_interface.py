"""Test stand-in for FlashAttention-3's `flash_attn_interface` (the Hopper build, package
flash_attn_3), not the library: `flash_attn_func` with FA3's signature and conventions, computed with
torch in float64 on the CPU.

Conventions followed (hopper/flash_attn_interface.py, hopper/flash_api.cpp): q (batch, seq_q, heads,
head_dim), k (batch, seq_kv, heads_kv, head_dim), v (batch, seq_kv, heads_kv, head_dim_v); fp16, bf16
or float8_e4m3fn, one dtype; head dims at most 256 and multiples of 8 (16 for FP8); head_dim_v !=
head_dim only for head_dim in (128, 192] with head_dim_v in (96, 128], or head_dim <= 64 with
head_dim_v <= 512 (256 for FP8); q_descale, k_descale, v_descale float32 of shape (batch, heads_kv),
FP8 only, each multiplying its tensor's values (a query head uses its kv head's q_descale); the
output of FP8 inputs is bf16; causal aligned to the bottom right. It returns the output alone unless
return_attn_probs, as FA3 does since commit 203b9b3; set RETURNS_LSE_ALWAYS to emulate the earlier
versions, which always returned (out, softmax_lse). window_size (left, right) as mha_fwd takes it:
bottom-right, -1 unbounded, left >= seq_kv - 1 and right >= seq_q - 1 made unbounded, causal setting
right to 0; softcap s makes each scaled score x s·tanh(x / s). Other options raise. The last call's arguments
are in LAST_CALL.
"""
import torch

from _stand_in_math import attention_fp64, window_visible
from _stand_in_record import record

LAST_CALL = {}
RETURNS_LSE_ALWAYS = False


def _dequantize(x, descale, name, batch, heads_kv):
    if descale is None:
        return x.to(torch.float64)
    if descale.dtype != torch.float32 or tuple(descale.shape) != (batch, heads_kv):
        raise RuntimeError(f"{name} must be float32 of shape {(batch, heads_kv)}, got {descale.dtype} "
                           f"{tuple(descale.shape)}")
    group = x.shape[2] // heads_kv
    return x.to(torch.float64) * descale.to(torch.float64).repeat_interleave(group, dim=1)[:, None, :, None]


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                    v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                    pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False):
    record(LAST_CALL, locals(), tensors=("q", "k", "v"))
    fp8 = q.dtype == torch.float8_e4m3fn
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float8_e4m3fn):
        raise RuntimeError("FlashAttention-3 takes fp16, bf16 and float8_e4m3fn inputs")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise RuntimeError("query and key/value must have the same dtype")
    batch, seq_q, heads, head_dim = q.shape
    _, seq_kv, heads_kv, head_dim_v = v.shape
    if tuple(k.shape) != (batch, seq_kv, heads_kv, head_dim):
        raise RuntimeError(f"k must be {(batch, seq_kv, heads_kv, head_dim)}, got {tuple(k.shape)}")
    if heads % heads_kv:
        raise RuntimeError("Number of heads in key/value must divide number of heads in query")
    if head_dim > 256:
        raise RuntimeError("FlashAttention forward only supports head dimension at most 256")
    alignment = 16 if fp8 else 8
    if head_dim % alignment or head_dim_v % alignment:
        raise RuntimeError(f"head_size should be a multiple of {alignment}")
    if head_dim_v != head_dim and not ((128 < head_dim <= 192 and 96 < head_dim_v <= 128)
                                       or (head_dim <= 64 and head_dim_v <= (256 if fp8 else 512))):
        raise RuntimeError("If V headdim is different from Q/K dim, we only support Q/K headdim in (128, 192] and V "
                           "headdim in (96, 128], or (Q/K <= 64 and V <= 512).")
    if not fp8 and any(d is not None for d in (q_descale, k_descale, v_descale)):
        raise NotImplementedError("the stand-in takes descales with FP8 inputs only")
    if qv is not None or attention_chunk:
        raise NotImplementedError("the stand-in does not emulate qv or attention_chunk")
    left, right = window_size
    if left >= seq_kv - 1:
        left = -1
    if right >= seq_q - 1:
        right = -1
    if causal:
        right = 0
    if softmax_scale is None:
        softmax_scale = head_dim ** -0.5
    q64 = _dequantize(q, q_descale, "q_descale", batch, heads_kv)
    k64 = _dequantize(k, k_descale, "k_descale", batch, heads_kv)
    v64 = _dequantize(v, v_descale, "v_descale", batch, heads_kv)
    visible = window_visible(seq_q, seq_kv, seq_kv - seq_q, left if left >= 0 else None, right if right >= 0 else None)
    out = attention_fp64(q64.transpose(1, 2), k64.transpose(1, 2), v64.transpose(1, 2), softmax_scale, visible,
                         softcap=softcap)
    out = out.to(torch.bfloat16 if fp8 else q.dtype).transpose(1, 2)
    lse = torch.zeros(batch, heads, seq_q)
    return (out, lse) if return_attn_probs or RETURNS_LSE_ALWAYS else out
