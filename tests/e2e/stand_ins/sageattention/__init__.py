"""Test stand-in for SageAttention (PyPI `sageattention`), not the library: the functions and modules
attnreplay's sageattention adapter reaches, with SageAttention's signatures and conventions,
computed with torch in float64 on the CPU from real INT8 / FP8 codes (HND layout only).

It is SageAttention 2.2.0 by default (sageattention/core.py): `sageattn_qk_int8_pv_fp16_triton`
(per-block INT8 Q and K, Q pre-scaled by sm_scale·log2 e, masks added in the log2 domain, a bool mask
True = may attend, no mask with causal), `sageattn_qk_int8_pv_fp8_cuda[_sm90]`, `quant`,
`triton.quant_per_thread` and the kernel extensions `_qattn_sm90` and `_qattn_sm89`. `sageattn_1_0_6`
is 1.0.6's `sageattn` (the Triton kernel; fp16, bf16 or fp32; head dims 64, 96, 128; it subtracts K's
mean from the caller's K in place, as 1.0.6 does): tests install it as `sageattn`, and remove
`sageattn_qk_int8_pv_fp16_triton`, to stand in for 1.0.x. Causal is top-left everywhere; head dims
below 128 are padded to 64 or 128 by the 2.x functions, above 128 rejected. The last call's arguments
are in LAST_CALL (in each module for its own functions).
"""

import torch

from _stand_in_math import attention_fp64, causal_visible
from _stand_in_record import record

from . import _qattn_sm89, _qattn_sm90, quant  # noqa: F401
from ._stand_in_quant import check_hnd, dequantize_int8, int8_codes, k_groups, q_groups
from .triton import quant_per_thread

LAST_CALL = {}
LOG2E = 1.4426950408889634


def _per_block_attention(q, k, v, is_causal, sm_scale, km=None, log2_bias=None):
    """Sage1's Triton arithmetic: Q·sm_scale·log2e per 128 rows and K per 64 keys to INT8, P·V in fp16."""
    q_rows, q_count = q_groups(q.shape[2], 128, 128, per_thread=False)
    k_rows, k_count = k_groups(k.shape[2], 64, 64, per_thread=False)
    k64 = k.to(torch.float64) if km is None else k.to(torch.float64) - km.to(torch.float64)
    q8, q_scale = int8_codes(q.to(torch.float64) * (sm_scale * LOG2E), q_rows, q_count)
    k8, k_scale = int8_codes(k64, k_rows, k_count)
    visible = causal_visible(q.shape[2], k.shape[2], 0) if is_causal else None
    # Scores come out in the log2 domain; a scale of 1/log2 e turns exp2 into exp.
    return attention_fp64(dequantize_int8(q8, q_scale, q_rows), dequantize_int8(k8, k_scale, k_rows),
                          v.to(torch.float16), 1 / LOG2E, visible, log2_bias=log2_bias)


def _pad_head_dim(*tensors):
    head_dim = tensors[0].size(-1)
    if head_dim > 128:
        raise ValueError(f"Unsupported head_dim: {head_dim}")
    padded = 64 if head_dim <= 64 else 128
    return tuple(torch.nn.functional.pad(t, (0, padded - head_dim)) for t in tensors)


def sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, return_lse=False, **kwargs):
    raise NotImplementedError("the stand-in does not emulate 2.x's GPU dispatcher `sageattn`")


def sageattn_1_0_6(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, smooth_k=True, **kwargs):
    record(LAST_CALL, locals(), tensors=("q", "k", "v"))
    LAST_CALL["function"] = "sageattn (1.0.6)"
    check_hnd(tensor_layout)
    dtype = q.dtype
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise AssertionError("Input tensors must be in dtype of torch.float16, torch.bfloat16, or torch.float32.")
    if k.dtype != dtype or v.dtype != dtype:
        raise AssertionError("All tensors must have the same dtype.")
    if q.size(-1) not in (64, 96, 128):
        raise AssertionError("headdim should be in [64, 96, 128].")
    km = None
    if smooth_k:
        km = k.mean(dim=2, keepdim=True)
        k -= km  # as 1.0.6 does, into the caller's tensor
    if sm_scale is None:
        sm_scale = q.size(-1) ** -0.5
    return _per_block_attention(q, k, v, is_causal, sm_scale).to(dtype)


def sageattn_qk_int8_pv_fp16_triton(q, k, v, tensor_layout="HND", quantization_backend="triton", is_causal=False,
                                    attn_mask=None, sm_scale=None, smooth_k=True, return_lse=False, **kwargs):
    record(LAST_CALL, locals(), tensors=("q", "k", "v"))
    LAST_CALL["function"] = "sageattn_qk_int8_pv_fp16_triton"
    check_hnd(tensor_layout)
    dtype = q.dtype
    if dtype not in (torch.float16, torch.bfloat16):
        raise AssertionError("Input tensors must be in dtype of torch.float16 or torch.bfloat16")
    if k.dtype != dtype or v.dtype != dtype:
        raise AssertionError("All tensors must have the same dtype.")
    if attn_mask is not None and attn_mask.dtype not in (torch.bool, dtype):
        raise AssertionError("attn_mask must be of dtype bool or the same dtype as q.")
    if is_causal and attn_mask is not None:
        raise AssertionError("Mask should be None for causal attention.")
    head_dim = q.size(-1)
    q, k, v = _pad_head_dim(q, k, v)
    km = k.mean(dim=2, keepdim=True) if smooth_k else None
    if sm_scale is None:
        sm_scale = head_dim ** -0.5
    log2_bias = None
    if attn_mask is not None:
        target = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        mask = attn_mask.expand(target)
        log2_bias = torch.where(mask, 0.0, -1.0e6) if mask.dtype == torch.bool else mask
    out = _per_block_attention(q, k, v, is_causal, sm_scale, km=km, log2_bias=log2_bias)
    return out.to(dtype)[..., :head_dim]


def _fp8_call(module, kernel_name, blocks, q, k, v, tensor_layout, is_causal, qk_quant_gran, sm_scale, smooth_k,
              scale_max, pad_v_to):
    check_hnd(tensor_layout)
    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise AssertionError("Input tensors must be in dtype of torch.float16 or torch.bfloat16")
    if qk_quant_gran not in ("per_warp", "per_thread"):
        raise AssertionError("qk_quant_gran must be either 'per_warp' or 'per_thread'.")
    head_dim = q.size(-1)
    q, k, v = _pad_head_dim(q, k, v)
    if sm_scale is None:
        sm_scale = head_dim ** -0.5
    km = k.mean(dim=2, keepdim=True) if smooth_k else None
    block_q, warp_q, block_k = blocks
    if qk_quant_gran == "per_warp":
        q8, q_scale, k8, k_scale = quant.per_warp_int8(q, k, km, BLKQ=block_q, WARPQ=warp_q, BLKK=block_k)
    else:
        q8, q_scale, k8, k_scale = quant_per_thread.per_thread_int8(q, k, km, BLKQ=block_q, WARPQ=warp_q,
                                                                    BLKK=block_k, WARPK=block_k)
    pad = -k.size(2) % pad_v_to
    if pad:
        v = torch.cat([v, v.new_zeros(v.size(0), v.size(1), pad, v.size(3))], dim=2)
    v8, v_scale, _ = quant.per_channel_fp8(v, scale_max=scale_max, smooth_v=False)
    o = torch.empty(q.size(), dtype=q.dtype)
    getattr(module, kernel_name)(q8, k8, v8, o, q_scale, k_scale, v_scale, 1, int(is_causal),
                                 3 if qk_quant_gran == "per_thread" else 2, sm_scale, 0)
    return o[..., :head_dim]


def sageattn_qk_int8_pv_fp8_cuda(q, k, v, tensor_layout="HND", is_causal=False, qk_quant_gran="per_thread",
                                 sm_scale=None, pv_accum_dtype="fp32+fp16", smooth_k=True, smooth_v=False,
                                 return_lse=False, **kwargs):
    kernels = {"fp32": "qk_int8_sv_f8_accum_f32_fuse_v_scale_attn",
               "fp32+fp32": "qk_int8_sv_f8_accum_f32_fuse_v_scale_attn_inst_buf",
               "fp32+fp16": "qk_int8_sv_f8_accum_f16_fuse_v_scale_attn_inst_buf"}
    return _fp8_call(_qattn_sm89, kernels[pv_accum_dtype], (128, 32, 64), q, k, v, tensor_layout, is_causal,
                     qk_quant_gran, sm_scale, smooth_k, 2.25 if pv_accum_dtype == "fp32+fp16" else 448.0, 1)


def sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v, tensor_layout="HND", is_causal=False, qk_quant_gran="per_thread",
                                      sm_scale=None, pv_accum_dtype="fp32+fp32", smooth_k=True, return_lse=False,
                                      **kwargs):
    if pv_accum_dtype == "fp32":
        raise NotImplementedError("Please use pv_accum_dtype='fp32+fp32' for sm90.")
    return _fp8_call(_qattn_sm90, "qk_int8_sv_f8_accum_f32_fuse_v_scale_attn_inst_buf", (64, 16, 128), q, k, v,
                     tensor_layout, is_causal, qk_quant_gran, sm_scale, smooth_k, 448.0, 128)
