"""Test stand-in for flash-attn 2 (FlashAttention-2), not the library: `flash_attn_func` with
FlashAttention-2's signature and conventions, computed with torch in float64 on the CPU.

Conventions followed (flash_attn/flash_attn_interface.py, csrc/flash_attn/flash_api.cpp): q (batch,
seq_q, heads, head_dim), k and v (batch, seq_kv, heads_kv, head_dim) with heads a multiple of heads_kv;
fp16 or bf16, one dtype; one head dim for q, k and v, at most 256; causal aligned to the bottom right
(key j visible to query i when j <= i + seq_kv - seq_q; rows that see nothing are zero); returns the
output alone unless return_attn_probs. Windows, softcap and ALiBi as mha_fwd (csrc/flash_attn/flash_api.cpp)
takes them: window_size (left, right) bottom-right, -1 unbounded, a side >= seq_kv made unbounded, then
causal setting right to 0 (unless seq_q is 1 without ALiBi), then an unbounded side beside a bounded one
set to seq_kv; softcap s making each scaled score x s·tanh(x / s); alibi_slopes fp32 (heads) or
(batch, heads), subtracting slope·|i + seq_kv - seq_q - j| after the softcap. Dropout raises.
The last call's arguments are in LAST_CALL. Like the real package, `flash_attn` is a namespace that
FlashAttention-4's `flash_attn.cute` shares.
"""
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
__version__ = "2.8.3"

import torch

from _stand_in_math import alibi_bias, attention_fp64, window_visible
from _stand_in_record import record

LAST_CALL = {}


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    record(LAST_CALL, locals(), tensors=("q", "k", "v"))
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError("FlashAttention only support fp16 and bf16 data type")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise RuntimeError("query and key/value must have the same dtype")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise RuntimeError("q, k, v must be (batch_size, seqlen, nheads, headdim)")
    batch, seq_q, heads, head_dim = q.shape
    _, seq_kv, heads_kv, _ = k.shape
    if tuple(k.shape) != (batch, seq_kv, heads_kv, head_dim) or tuple(v.shape) != (batch, seq_kv, heads_kv, head_dim):
        raise RuntimeError(f"k and v must be {(batch, seq_kv, heads_kv, head_dim)}, "
                           f"got {tuple(k.shape)}, {tuple(v.shape)}")
    if heads % heads_kv:
        raise RuntimeError("Number of heads in key/value must divide number of heads in query")
    if head_dim > 256:
        raise RuntimeError("FlashAttention forward only supports head dimension at most 256")
    if dropout_p:
        raise NotImplementedError("the stand-in does not emulate dropout")
    bias = None
    if alibi_slopes is not None:
        if alibi_slopes.dtype != torch.float32:
            raise RuntimeError("ALiBi slopes must have dtype fp32")
        if alibi_slopes.stride(-1) != 1 or tuple(alibi_slopes.shape) not in ((heads,), (batch, heads)):
            raise RuntimeError("alibi_slopes must be (nheads) or (batch_size, nheads) with a contiguous last dim")
        bias = alibi_bias(alibi_slopes, seq_q, seq_kv, seq_kv - seq_q)
    left, right = window_size
    if left >= seq_kv:
        left = -1
    if right >= seq_kv:
        right = -1
    if seq_q == 1 and alibi_slopes is None:
        causal = False  # mha_fwd: the same as causal for one query row
    if causal:
        right = 0
    if left < 0 and right >= 0:
        left = seq_kv
    if left >= 0 and right < 0:
        right = seq_kv
    visible = window_visible(seq_q, seq_kv, seq_kv - seq_q, left if left >= 0 else None, right if right >= 0 else None)
    if softmax_scale is None:
        softmax_scale = head_dim ** -0.5
    out = attention_fp64(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale, visible, bias=bias,
                         softcap=softcap)
    out = out.to(q.dtype).transpose(1, 2)
    return (out, None, None) if return_attn_probs else out


# As the real package does, the KV-cache entry point is re-exported from flash_attn_interface.
from flash_attn.flash_attn_interface import flash_attn_with_kvcache  # noqa: E402
