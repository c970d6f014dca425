"""Test stand-in for FlashAttention-4's `flash_attn.cute.interface`, not the library:
`flash_attn_func` and `flash_attn_varlen_func` with FA4's signatures and conventions, computed with
torch in float64 on the CPU.

Conventions followed (flash_attn/cute/interface.py, mask.py, seqlen_info.py): q (batch, seq_q, heads,
head_dim), k (batch, seq_kv, heads_kv, head_dim), v (batch, seq_kv, heads_kv, head_dim_v); fp16 or
bf16, one dtype; head dims multiples of 8 within [8, 256] (its sm90 rule); causal aligned to the
bottom right; returns (out, lse), lse None unless return_lse. The varlen function takes q (total_q,
heads, head_dim) with cu_seqlens_q (batch + 1), k and v packed (total_k, heads_kv, dim) with
cu_seqlens_k, or pages (pages, page_size, heads_kv, dim) with page_table (batch, pages a sequence)
and no cu_seqlens_k; seqused_q and seqused_k (batch) cut each sequence's queries and keys; every
index tensor int32 and contiguous; sequence b attends to its own keys, causal bottom-right within it
(seqlen_k - seqlen_q of that sequence); rows that see no key are zeros. max_seqlen_q and
max_seqlen_k size the real kernel's grid and are not checked there: one below a sequence's length
raises here. window_size (left, right), None unbounded, bottom-right (per sequence), causal setting
right to 0 and a left + right below 0 dropping the window (_resolve_causal_local_window); softcap s
makes each scaled score x s·tanh(x / s); learnable_sink (heads) fp16/bf16/fp32 joins each row's
denominator as an unscaled logit. The CuTe-DSL hooks (score_mod, mask_mod, ...) and the other options
are not emulated and raise. The last call's arguments are in LAST_CALL (either function).
"""
import math

import torch

from _stand_in_math import attention_fp64, window_visible
from _stand_in_record import record

LAST_CALL = {}


def _check_dtypes_and_dims(q, k, v):
    if v.dtype not in (torch.float16, torch.bfloat16):
        raise AssertionError("the stand-in takes fp16 and bf16 inputs")
    if q.dtype != v.dtype or k.dtype != v.dtype:
        raise AssertionError("q, k, v, and qv must have the same dtype")
    heads, head_dim = q.shape[-2:]
    heads_kv, head_dim_v = v.shape[-2:]
    if k.shape[-2:] != (heads_kv, head_dim):
        raise AssertionError(f"k must have {heads_kv} heads of {head_dim}, got {tuple(k.shape)}")
    if heads % heads_kv:
        raise AssertionError("num_head must be divisible by num_head_kv")
    if not (8 <= head_dim <= 256 and 8 <= head_dim_v <= 256) or head_dim % 8 or head_dim_v % 8:
        raise AssertionError(f"(head_dim, head_dim_v)=({head_dim}, {head_dim_v}) is not supported on SM90.")
    return head_dim


def _window(causal, window_size):
    """(left, right) as FlashAttention-4 resolves them with causal, None unbounded."""
    left, right = window_size
    if causal:
        right = 0
    if left is not None and right is not None and left + right < 0:
        left = right = None
    return left, right


def _check_sink(learnable_sink, heads):
    if learnable_sink is None:
        return None
    if tuple(learnable_sink.shape) != (heads,):
        raise AssertionError(f"learnable_sink must have shape ({heads},), got {tuple(learnable_sink.shape)}")
    if learnable_sink.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise AssertionError("learnable_sink must be float16, bfloat16, or float32")
    return learnable_sink


def _refuse_unemulated(*options):
    if any(option is not None for option in options):
        raise NotImplementedError("the stand-in does not emulate FA4's options beyond scale, causal, window_size, "
                                  "softcap and learnable_sink")


def flash_attn_func(q, k, v, qv=None, gather_kv_indices=None, softmax_scale=None, causal=False,
                    window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None,
                    deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None, aux_tensors=None,
                    aux_scalars=None, block_sparse_tensors=None, block_sparse_tensors_bwd=None, return_lse=False):
    record(LAST_CALL, locals(), tensors=("q", "k", "v"))
    head_dim = _check_dtypes_and_dims(q, k, v)
    batch, seq_q, heads, _ = q.shape
    _, seq_kv, heads_kv, _ = v.shape
    if tuple(k.shape) != (batch, seq_kv, heads_kv, head_dim):
        raise AssertionError(f"k must be {(batch, seq_kv, heads_kv, head_dim)}, got {tuple(k.shape)}")
    _refuse_unemulated(qv, gather_kv_indices, score_mod, mask_mod, block_sparse_tensors)
    sink = _check_sink(learnable_sink, q.shape[-2])
    left, right = _window(causal, window_size)
    if softmax_scale is None:
        softmax_scale = head_dim ** -0.5
    visible = window_visible(seq_q, seq_kv, seq_kv - seq_q, left, right)
    out = attention_fp64(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale, visible,
                         softcap=softcap, sinks=sink)
    return out.to(q.dtype).transpose(1, 2), None


def _check_index(tensor, name, shape):
    if tensor is None:
        return None
    if tensor.dtype != torch.int32:
        raise AssertionError(f"{name} must be int32")
    if tensor.stride(-1) != 1:
        raise AssertionError(f"{name} must be contiguous")
    if tuple(tensor.shape) != shape:
        raise AssertionError(f"{name} must have shape {shape}, got {tuple(tensor.shape)}")
    return tensor.tolist()


def flash_attn_varlen_func(q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                           max_seqlen_k=None, min_seqlen_k=None, seqused_q=None, seqused_k=None,
                           gather_kv_indices=None, page_table=None, softmax_scale=None, causal=False,
                           window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None,
                           deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None,
                           block_sparse_tensors=None, aux_tensors=None, aux_scalars=None, return_lse=False,
                           scheduler_metadata=None, seqlen_k_per_split=None, disable_scheduler_metadata=False):
    record(LAST_CALL, locals(), tensors=("q", "k", "v"))
    head_dim = _check_dtypes_and_dims(q, k, v)
    _refuse_unemulated(qv, gather_kv_indices, score_mod, mask_mod, block_sparse_tensors)
    sink = _check_sink(learnable_sink, q.shape[-2])
    left, right = _window(causal, window_size)
    batch = q.shape[0] if cu_seqlens_q is None else cu_seqlens_q.shape[0] - 1
    if page_table is not None:
        if cu_seqlens_k is not None:
            raise AssertionError("page_table is not supported with cu_seqlens_k")
        table = _check_index(page_table, "page_table", (batch, page_table.shape[1]))
        num_pages, page_size = v.shape[:2]
        if k.dim() != 4 or tuple(k.shape[:2]) != (num_pages, page_size):
            raise AssertionError(f"k must be (num_pages, page_size, heads_kv, head_dim), got {tuple(k.shape)}")
        seqlen_k = num_pages * page_size
    else:
        seqlen_k = v.shape[-3]
    cu_q = _check_index(cu_seqlens_q, "cu_seqlens_q", (batch + 1,))
    cu_k = _check_index(cu_seqlens_k, "cu_seqlens_k", (batch + 1,))
    used_q = _check_index(seqused_q, "seqused_q", (batch,))
    used_k = _check_index(seqused_k, "seqused_k", (batch,))
    if (cu_q is None) != (q.dim() == 4) or (page_table is None and (cu_k is None) != (k.dim() == 4)):
        raise AssertionError("q, k, v are (total, heads, dim) with cu_seqlens, else (batch, seq, heads, dim)")
    if softmax_scale is None:
        softmax_scale = head_dim ** -0.5
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    for b in range(batch):
        packed_q = cu_q is not None
        q_first = cu_q[b] if packed_q else 0
        q_len = used_q[b] if used_q is not None else (cu_q[b + 1] - cu_q[b] if packed_q else q.shape[1])
        k_len = used_k[b] if used_k is not None else (cu_k[b + 1] - cu_k[b] if cu_k is not None else seqlen_k)
        if max_seqlen_q is not None and q_len > max_seqlen_q or max_seqlen_k is not None and k_len > max_seqlen_k:
            raise ValueError(f"sequence {b} has {q_len} queries and {k_len} keys, above max_seqlen_q "
                             f"{max_seqlen_q} or max_seqlen_k {max_seqlen_k}")
        if q_len == 0 or k_len == 0:
            continue  # its rows stay zeros
        queries = q[q_first:q_first + q_len] if packed_q else q[b, :q_len]
        if page_table is not None:
            pages = torch.tensor(table[b][:math.ceil(k_len / page_size)], dtype=torch.long)
            keys, values = (t[pages].flatten(0, 1)[:k_len] for t in (k, v))
        elif cu_k is not None:
            keys, values = k[cu_k[b]:cu_k[b] + k_len], v[cu_k[b]:cu_k[b] + k_len]
        else:
            keys, values = k[b, :k_len], v[b, :k_len]
        visible = window_visible(q_len, k_len, k_len - q_len, left, right)
        attended = attention_fp64(queries.transpose(0, 1)[None], keys.transpose(0, 1)[None],
                                  values.transpose(0, 1)[None], softmax_scale, visible, softcap=softcap, sinks=sink)
        rows = attended[0].transpose(0, 1).to(q.dtype)
        if packed_q:
            out[q_first:q_first + q_len] = rows
        else:
            out[b, :q_len] = rows
    return out, None
