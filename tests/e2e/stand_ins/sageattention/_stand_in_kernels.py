"""Test stand-in helper of the sageattention stand-in, not the library: SageAttention2's FP8 attention
kernels (the functions of its _qattn_sm90 / _qattn_sm89 extensions) on already-quantized inputs, with
their argument checks, computed by dequantizing into float64 (P is not quantized to FP8 here)."""
import math

import torch

from _stand_in_math import attention_fp64, causal_visible
from _stand_in_record import record

from ._stand_in_quant import check_hnd, dequantize_int8, k_groups, q_groups


def _check_shape(name, tensor, expected):
    if tuple(tensor.shape) != tuple(expected):
        raise RuntimeError(f"{name} must have shape {tuple(expected)}, got {tuple(tensor.shape)}")


def make_kernel(module_name, kernel_name, cta_q, cta_k, last_call):
    """A kernel of a build whose CTA covers `cta_q` query rows (four warps) and `cta_k` keys."""
    warp_q = cta_q // 4

    def kernel(query, key, value, output, query_scale, key_scale, value_scale, tensor_layout, is_causal,
               qk_quant_gran, sm_scale, return_lse):
        record(last_call, locals(), tensors=("query", "key", "value", "output"))
        last_call["kernel"] = f"{module_name}.{kernel_name}"
        check_hnd(tensor_layout)
        if query.dtype != torch.int8 or key.dtype != torch.int8:
            raise RuntimeError("query and key must be int8")
        if value.dtype != torch.float8_e4m3fn:
            raise RuntimeError("value must be float8_e4m3fn")
        if output.dtype not in (torch.float16, torch.bfloat16):
            raise RuntimeError("output must be float16 or bfloat16")
        if qk_quant_gran not in (2, 3):
            raise RuntimeError("qk_quant_gran must be 2 (per warp) or 3 (per thread)")
        batch, heads, qo_len, head_dim = query.shape
        _, heads_kv, kv_len, _ = key.shape
        if head_dim not in (64, 128):
            raise RuntimeError(f"head_dim must be 64 or 128, got {head_dim}")
        if heads % heads_kv:
            raise RuntimeError("num_qo_heads must be a multiple of num_kv_heads")
        _check_shape("key", key, (batch, heads_kv, kv_len, head_dim))
        _check_shape("output", output, (batch, heads, qo_len, head_dim))
        padded = math.ceil(kv_len / cta_k) * cta_k
        if value.shape[:3] != (batch, heads_kv, head_dim) or value.shape[3] < padded:
            raise RuntimeError(f"value must be (batch, heads_kv, head_dim, >= {padded}), got {tuple(value.shape)}")
        per_thread = qk_quant_gran == 3
        rows, q_count = q_groups(qo_len, cta_q, warp_q, per_thread)
        keys, k_count = k_groups(kv_len, cta_k, cta_k, per_thread)
        _check_shape("query_scale", query_scale, (batch, heads, q_count))
        _check_shape("key_scale", key_scale, (batch, heads_kv, k_count))
        _check_shape("value_scale", value_scale, (batch, heads_kv, head_dim))
        q = dequantize_int8(query, query_scale, rows)
        k = dequantize_int8(key, key_scale, keys)
        v = value[..., :kv_len].to(torch.float64).transpose(2, 3) * value_scale.to(torch.float64)[:, :, None, :]
        visible = causal_visible(qo_len, kv_len, 0) if is_causal else None
        output.copy_(attention_fp64(q, k, v, sm_scale, visible).to(output.dtype))
        return torch.empty(batch, heads, qo_len) if return_lse else torch.empty(0)

    kernel.__name__ = kernel_name
    return kernel
