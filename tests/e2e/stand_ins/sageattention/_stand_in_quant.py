"""Test stand-in helper of the sageattention stand-in, not the library: SageAttention's quantization
groups and INT8 / FP8 codes, exact in float64 so that the stand-in's kernels can dequantize them.

Groups (as the scale tensors' sizes in SageAttention's quant.py and triton/quant_per_thread.py
imply): Q per warp: row i in group i // WARPQ, ceil(len/BLKQ)·(BLKQ/WARPQ) groups; Q per thread:
(i // WARPQ)·8 + i % 8, eight times as many; K per block: key j in group j // BLKK; K per thread:
(j // WARPK)·4 + (j % 8) // 2, ceil(len/BLKK)·(BLKK/WARPK)·4 groups."""
import math

import torch


def q_groups(length, block, warp, per_thread):
    rows = torch.arange(length)
    count = math.ceil(length / block) * (block // warp)
    if per_thread:
        return (rows // warp) * 8 + rows % 8, count * 8
    return rows // warp, count


def k_groups(length, block, warp, per_thread):
    keys = torch.arange(length)
    if per_thread:
        return (keys // warp) * 4 + (keys % 8) // 2, math.ceil(length / block) * (block // warp) * 4
    return keys // block, math.ceil(length / block)


def int8_codes(x, groups, count):
    """(codes int8, scale float32 (b, h, count)) for x (b, h, len, d): per group amax / 127."""
    x = x.to(torch.float64)
    b, h, length, _ = x.shape
    row_amax = x.abs().amax(dim=-1)
    amax = torch.zeros(b, h, count, dtype=torch.float64).scatter_reduce(
        2, groups.expand(b, h, length), row_amax, reduce="amax", include_self=True)
    scale = (amax / 127).to(torch.float32)
    per_row = scale.to(torch.float64)[..., groups][..., None]
    codes = torch.where(per_row > 0, torch.round(x / torch.where(per_row > 0, per_row, 1.0)), 0.0)
    return codes.clamp(-127, 127).to(torch.int8), scale


def dequantize_int8(codes, scale, groups):
    return codes.to(torch.float64) * scale.to(torch.float64)[..., groups][..., None]


def check_hnd(tensor_layout):
    if tensor_layout not in ("HND", "NHD", 0, 1):
        raise ValueError(f"Unknown tensor layout: {tensor_layout}")
    if tensor_layout in ("NHD", 0):
        raise NotImplementedError("the stand-in emulates the HND layout only")
