"""Test stand-in for `sageattention.triton.quant_per_thread`, not the library: per_thread_int8 with
SageAttention's signature and outputs' shapes (HND layout only)."""
import torch

from _stand_in_record import record

from .._stand_in_quant import check_hnd, int8_codes, k_groups, q_groups
from ..quant import _smoothed

LAST_CALL = {}


def per_thread_int8(q, k, km=None, BLKQ=128, WARPQ=32, BLKK=64, WARPK=64, sm_scale=None, tensor_layout="HND"):
    record(LAST_CALL, locals(), tensors=("q", "k"))
    check_hnd(tensor_layout)
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError("q and k must be torch.float16 or torch.bfloat16")
    groups, count = q_groups(q.shape[2], BLKQ, WARPQ, per_thread=True)
    q8, q_scale = int8_codes(q, groups, count)
    groups, count = k_groups(k.shape[2], BLKK, WARPK, per_thread=True)
    k8, k_scale = int8_codes(_smoothed(k, km), groups, count)
    return q8, q_scale, k8, k_scale
