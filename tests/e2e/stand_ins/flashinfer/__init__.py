"""Test stand-in for FlashInfer, not the library: `single_prefill_with_kv_cache` and `packbits` with
FlashInfer's signatures and conventions, computed with torch in float64 on the CPU.

Conventions followed (flashinfer 0.6.18, flashinfer/prefill.py, quantization/packbits.py): q (qo_len,
heads_q, head_dim) and, in kv_layout "NHD", k and v (kv_len, heads_kv, head_dim) ("HND": heads first);
one request, no batch dim; fp16 or bf16 (FP8 scales not emulated), heads_q a multiple of heads_kv;
causal keeps key j for query i when j <= i + kv_len - qo_len (bottom-right) and is ignored when a
custom mask is given; custom_mask bool (qo_len, kv_len), True = may attend, or packed_custom_mask, its
bits packed little-endian by packbits(x, bitorder="little") (which wins when both are given); returns
the output, or (output, lse) with return_lse. Positional encodings, windows and soft caps raise. The
last call's arguments are in LAST_CALL.
"""
__version__ = "0.6.18"

import torch

from _stand_in_math import attention_fp64, causal_visible
from _stand_in_record import record

LAST_CALL = {}


def packbits(x, bitorder="big"):
    bits = x.reshape(-1).to(torch.bool)
    padded = torch.zeros(-(-bits.numel() // 8) * 8, dtype=torch.uint8)
    padded[:bits.numel()] = bits.to(torch.uint8)
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128] if bitorder == "little" else [128, 64, 32, 16, 8, 4, 2, 1],
                           dtype=torch.uint8)
    return (padded.view(-1, 8) * weights).sum(dim=1).to(torch.uint8)


def _unpack_little(packed, count):
    shifts = torch.arange(8, dtype=torch.uint8)
    bits = (packed[:, None] >> shifts) & 1
    return bits.reshape(-1)[:count].to(torch.bool)


def single_prefill_with_kv_cache(q, k, v, scale_q=None, scale_k=None, scale_v=None, o_dtype=None, custom_mask=None,
                                 packed_custom_mask=None, causal=False, kv_layout="NHD", pos_encoding_mode="NONE",
                                 use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
                                 rope_scale=None, rope_theta=None, backend="auto", return_lse=False, kv_cache_sf=None,
                                 k_scale=None, v_scale=None):
    record(LAST_CALL, locals(), tensors=("q", "k", "v"))
    if kv_layout not in ("NHD", "HND"):
        raise KeyError(f"Invalid kv_layout {kv_layout}")
    if pos_encoding_mode not in ("NONE", "ROPE_LLAMA", "ALIBI"):
        raise KeyError(f"Invalid pos_encoding_mode {pos_encoding_mode}")
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError("q, k, v must be 3-D: (qo_len, heads, head_dim) and (kv_len, heads_kv, head_dim) in NHD")
    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise NotImplementedError("the stand-in takes fp16 or bf16 q, k, v of one dtype")
    if pos_encoding_mode != "NONE" or window_left != -1 or logits_soft_cap or kv_cache_sf is not None:
        raise NotImplementedError("the stand-in does not emulate positional encodings, windows or soft caps")
    if kv_layout == "HND":
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    qo_len, heads, head_dim = q.shape
    kv_len, heads_kv, _ = k.shape
    if k.shape[-1] != head_dim or v.shape[:2] != k.shape[:2]:
        raise ValueError("k and v must match q's head_dim and each other's kv_len and heads")
    if heads % heads_kv:
        raise ValueError("num_qo_heads must be a multiple of num_kv_heads")
    if custom_mask is not None and packed_custom_mask is None:
        if custom_mask.dtype != torch.bool or custom_mask.numel() != qo_len * kv_len:
            raise ValueError(f"custom_mask must be bool of shape {(qo_len, kv_len)}")
        packed_custom_mask = packbits(custom_mask.contiguous().view(-1), bitorder="little")
    if packed_custom_mask is not None:
        if packed_custom_mask.dtype != torch.uint8 or packed_custom_mask.numel() != -(-qo_len * kv_len // 8):
            raise ValueError("packed_custom_mask must be uint8 with ceil(qo_len * kv_len / 8) bytes")
        visible = _unpack_little(packed_custom_mask, qo_len * kv_len).view(qo_len, kv_len)
    elif causal:
        visible = causal_visible(qo_len, kv_len, kv_len - qo_len)
    else:
        visible = None
    if sm_scale is None:
        sm_scale = head_dim ** -0.5
    out = attention_fp64(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], sm_scale, visible)
    out = out[0].transpose(0, 1).to(o_dtype or q.dtype)
    return (out, torch.zeros(qo_len, heads)) if return_lse else out
