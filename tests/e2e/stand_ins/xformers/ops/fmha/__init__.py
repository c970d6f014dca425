"""Test stand-in for `xformers.ops.fmha`, not the library: `memory_efficient_attention` with
xFormers' signature and conventions, computed with torch in float64 on the CPU.

Conventions followed (xformers 0.0.35, xformers/ops/fmha/__init__.py, common.py, cutlass.py): query,
key, value all BMK, BMHK (batch, seq, heads, dim) or BMGHK (batch, seq, groups, heads, dim), of one
rank and one dtype (fp16, bf16, fp32); no broadcasting: key and value have the query's heads (and
groups); the value's dim may differ; attn_bias None, LowerTriangularMask (top-left),
LowerTriangularFromBottomRightMask (bottom-right), LowerTriangularMaskWithTensorBias, or a tensor of
exactly (batch, heads, seq_q, seq_kv) for BMHK, in the query's dtype, whose strides but the last are
multiples of 128 bits (8 fp16 elements), the last 1 (or 0); output like the query with the value's
dim. Dropout is not emulated and raises. The last call's arguments are in LAST_CALL.
"""
import torch

from _stand_in_math import attention_fp64, causal_visible
from _stand_in_record import record

from . import attn_bias
from .attn_bias import (AttentionBias, LowerTriangularFromBottomRightMask, LowerTriangularMask,  # noqa: F401
                        LowerTriangularMaskWithTensorBias)

LAST_CALL = {}


def _check_bias_tensor(bias, query, expected_shape):
    if bias.dtype != query.dtype:
        raise ValueError(f"attn_bias dtype {bias.dtype} != query dtype {query.dtype}")
    if tuple(bias.shape) != expected_shape:
        raise ValueError(f"Invalid shape for attention bias: {tuple(bias.shape)} (expected {expected_shape})")
    alignment = 128 // torch.finfo(bias.dtype).bits
    for d in range(bias.dim() - 1):
        if bias.stride(d) % alignment:
            raise NotImplementedError(f"attn_bias.stride(-2) % {alignment} != 0 (attn_bias.stride() = {bias.stride()})")
    if bias.stride(-1) > 1:
        raise NotImplementedError(f"attn_bias.stride(-1) > 1 (attn_bias.stride() = {bias.stride()})")


def memory_efficient_attention(query, key, value, attn_bias=None, p=0.0, scale=None, *, op=None, output_dtype=None):
    record(LAST_CALL, locals(), tensors=("query", "key", "value"))
    qkv = (query, key, value)
    if query.dim() not in (3, 4, 5) or any(x.dim() != query.dim() for x in qkv):
        raise ValueError("Query/Key/Value should all have BMGHK, BMHK or BMK shape.")
    if any(x.dtype != query.dtype for x in qkv) or query.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError("Query/Key/Value should all have the same dtype, one of fp16, bf16, fp32")
    if p:
        raise NotImplementedError("the stand-in does not emulate dropout")
    if query.dim() == 3:
        query, key, value = (x.unsqueeze(2) for x in qkv)
    B, Mq = query.shape[:2]
    Mkv = key.shape[1]
    K, Kv = query.shape[-1], value.shape[-1]
    lead = tuple(query.shape[2:-1])  # (H,) or (G, H)
    if tuple(key.shape) != (B, Mkv, *lead, K) or tuple(value.shape) != (B, Mkv, *lead, Kv):
        raise ValueError("Incompatible shapes for attention inputs: HINT: We don't support broadcasting, please "
                         "use `expand` yourself before calling `memory_efficient_attention` if you need to")
    heads = 1
    for n in lead:
        heads *= n
    # To (B, heads, M, K): groups and heads flattened in order, as the kernels index them.
    to_bhsd = lambda x: x.reshape(x.shape[0], x.shape[1], heads, x.shape[-1]).transpose(1, 2)
    visible, bias = None, None
    if isinstance(attn_bias, torch.Tensor) or isinstance(attn_bias, LowerTriangularMaskWithTensorBias):
        tensor = attn_bias if isinstance(attn_bias, torch.Tensor) else attn_bias._bias
        if query.dim() != 4:
            raise NotImplementedError("the stand-in takes tensor biases with BMHK inputs only")
        _check_bias_tensor(tensor, query, (B, lead[0], Mq, Mkv))
        bias = tensor
    if isinstance(attn_bias, LowerTriangularFromBottomRightMask):
        visible = causal_visible(Mq, Mkv, Mkv - Mq)
    elif isinstance(attn_bias, LowerTriangularMask):
        visible = causal_visible(Mq, Mkv, 0)
    elif attn_bias is not None and not isinstance(attn_bias, torch.Tensor):
        raise NotImplementedError(f"the stand-in does not emulate {type(attn_bias).__name__}")
    if scale is None:
        scale = K ** -0.5
    out = attention_fp64(to_bhsd(query), to_bhsd(key), to_bhsd(value), scale, visible, bias)
    out = out.transpose(1, 2).reshape(B, Mq, *lead, Kv)
    return out.to(output_dtype or query.dtype)
