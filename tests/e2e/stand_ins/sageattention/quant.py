"""Test stand-in for `sageattention.quant`, not the library: per_warp_int8 and per_channel_fp8 with
SageAttention's signatures, outputs' shapes and dtypes (HND layout only). The last call of each is in
LAST_CALL[function name]."""
import math

import torch

from _stand_in_record import record

from ._stand_in_quant import check_hnd, int8_codes, k_groups, q_groups

LAST_CALL = {}


def _smoothed(k, km):
    if km is None:
        return k.to(torch.float64)
    if tuple(km.shape) != (k.shape[0], k.shape[1], 1, k.shape[3]):
        raise ValueError(f"km must be (batch, heads_kv, 1, head_dim) in HND, got {tuple(km.shape)}")
    return k.to(torch.float64) - km.to(torch.float64)


def per_warp_int8(q, k, km=None, BLKQ=128, WARPQ=32, BLKK=64, tensor_layout="HND"):
    record(LAST_CALL.setdefault("per_warp_int8", {}), locals(), tensors=("q", "k"))
    check_hnd(tensor_layout)
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError("The tensors q and k must have the dtype torch.float16 or torch.bfloat16")
    groups, count = q_groups(q.shape[2], BLKQ, WARPQ, per_thread=False)
    q8, q_scale = int8_codes(q, groups, count)
    groups, count = k_groups(k.shape[2], BLKK, BLKK, per_thread=False)
    k8, k_scale = int8_codes(_smoothed(k, km), groups, count)
    return q8, q_scale, k8, k_scale


def per_channel_fp8(v, tensor_layout="HND", scale_max=448.0, smooth_v=True):
    record(LAST_CALL.setdefault("per_channel_fp8", {}), locals(), tensors=("v",))
    check_hnd(tensor_layout)
    if smooth_v:
        raise NotImplementedError("the stand-in does not emulate smooth_v")
    b, h, kv_len, d = v.shape
    padded = math.ceil(kv_len / 64) * 64
    v64 = v.to(torch.float64)
    scale = (v64.abs().amax(dim=2) / scale_max).to(torch.float32)  # (b, h, d)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale)).to(torch.float64)
    v_fp8 = torch.zeros(b, h, d, padded, dtype=torch.float8_e4m3fn)
    v_fp8[..., :kv_len] = (v64 / safe[:, :, None, :]).clamp(-448, 448).transpose(2, 3).to(torch.float8_e4m3fn)
    return v_fp8, scale, None
