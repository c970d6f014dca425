"""Test stand-in helper, not FlashInfer: the batch conventions its wrappers share (flashinfer 0.6.18).

plan() takes the batch's offsets and page lists and keeps copies (the caller may reuse its
buffers); run() computes each sequence: queries qo_indptr[b]..qo_indptr[b+1] over keys
kv_indptr[b]..kv_indptr[b+1] (ragged), or over the pages paged_kv_indices[indptr[b]..indptr[b+1]]
in order, the last holding last_page_len[b] keys (paged). Causality and the left window align
bottom-right: query i of n_q sees key j of n_k when j <= i + n_k - n_q (causal) and
j >= i + n_k - n_q - window_left. logits_soft_cap caps the scaled scores; sinks (heads_q) join each
row's denominator. A paged cache is a (k, v) tuple or one (pages, 2, ...) tensor, each
(pages, page_size, heads_kv, dim) in NHD, (pages, heads_kv, page_size, dim) in HND. Rows that see no
key are zeros. Positional encodings, FP8 scales and custom masks raise; fp16 and bf16 only, on any
device.

What the real wrappers reject is rejected here: run() with q or k of other dtypes than plan()'s
q_data_type (default float16) and kv_data_type, a prefill q whose rows are not qo_indptr[-1], and q
on another device than the workspace. So are the page lists' documented preconditions, which the
real kernels read without checking: indptr, indices and last_page_len int32, and
1 <= last_page_len <= page_size. Each plan's arguments are in LAST_PLAN.
"""
from dataclasses import dataclass
from typing import Optional

import torch

from _stand_in_math import attention_fp64

LAST_PLAN = {}


def check_layout(kv_layout):
    if kv_layout not in ("NHD", "HND"):
        raise KeyError(f"Invalid kv_layout {kv_layout}")


def pages_of(paged_kv_cache, kv_layout):
    k, v = paged_kv_cache if isinstance(paged_kv_cache, (tuple, list)) else paged_kv_cache.unbind(1)
    return (k.transpose(1, 2), v.transpose(1, 2)) if kv_layout == "HND" else (k, v)


def as_torch_dtype(name):
    return getattr(torch, name) if isinstance(name, str) else name


@dataclass
class RaggedPlan:
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    causal: bool
    window_left: int
    logits_soft_cap: Optional[float]
    sm_scale: Optional[float]
    q_data_type: torch.dtype
    kv_data_type: torch.dtype


@dataclass
class PagedPlan:
    qo_indptr: torch.Tensor
    indptr: torch.Tensor
    indices: torch.Tensor
    last_page_len: torch.Tensor
    causal: bool
    window_left: int
    logits_soft_cap: Optional[float]
    sm_scale: Optional[float]
    # None where the entry point takes no dtypes to plan for (single_decode, MLA's stand-in).
    q_data_type: Optional[torch.dtype] = None
    kv_data_type: Optional[torch.dtype] = None


def unsupported(pos_encoding_mode="NONE", scales=(), custom_mask=None, packed_custom_mask=None):
    if pos_encoding_mode != "NONE" or any(s is not None for s in scales) or custom_mask is not None or \
            packed_custom_mask is not None:
        raise NotImplementedError("the stand-in does not emulate positional encodings, FP8 scales or custom masks")


def index_copy(tensor):
    return tensor.detach().to("cpu", torch.int64).clone()


def check_page_lists(indptr, indices, last_page_len, page_size):
    """The documented form of a paged plan's lists (flashinfer/decode.py's and prefill.py's docstrings)."""
    for name, tensor in (("indptr", indptr), ("indices", indices), ("last_page_len", last_page_len)):
        if tensor.dtype != torch.int32:
            raise ValueError(f"{name} must be torch.int32, got {tensor.dtype}")
    last = last_page_len.tolist()
    if any(not 1 <= n <= page_size for n in last):
        raise ValueError(f"last_page_len {last} must be within [1, page_size {page_size}]")


def record_plan(wrapper, arguments):
    LAST_PLAN.clear()
    LAST_PLAN.update({key: value.clone() if isinstance(value, torch.Tensor) else value
                      for key, value in arguments.items() if key != "self"})
    LAST_PLAN["wrapper"] = type(wrapper).__name__


def check_run(plan, workspace_device, q, k):
    """What the real run() checks before it launches anything."""
    if q.dtype != plan.q_data_type:
        raise ValueError(f"The dtype of q {q.dtype} does not match the q_data_type {plan.q_data_type} specified in "
                         f"plan function.")
    if k.dtype != plan.kv_data_type:
        raise ValueError(f"The dtype of k {k.dtype} does not match the kv_data_type {plan.kv_data_type} specified in "
                         f"plan function.")
    if q.size(0) != int(plan.qo_indptr[-1]):
        raise ValueError(f"q.shape[0] ({q.size(0)}) does not match qo_indptr[-1] ({int(plan.qo_indptr[-1])}).")
    if q.device != workspace_device:
        raise RuntimeError(f"q is on {q.device}, the workspace the plan lives in on {workspace_device}")


def run_batch(plan, q, keys_of, window_left=None, sinks=None, out=None, return_lse=False):
    """Every sequence b of the plan: keys_of(b) gives its (k, v), each (n_k, heads_kv, dim)."""
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise NotImplementedError("the stand-in takes fp16 or bf16")
    window = plan.window_left if window_left is None else window_left
    scale = plan.sm_scale if plan.sm_scale is not None else q.shape[-1] ** -0.5
    result = torch.zeros(q.shape[0], q.shape[1], keys_of(0)[1].shape[-1], dtype=q.dtype, device=q.device)
    for b in range(plan.qo_indptr.numel() - 1):
        first, end = int(plan.qo_indptr[b]), int(plan.qo_indptr[b + 1])
        k, v = keys_of(b)
        n_q, n_k = end - first, k.shape[0]
        if n_q == 0 or n_k == 0:
            continue  # its rows stay zeros
        rows = torch.arange(n_q, device=q.device)[:, None] + (n_k - n_q)
        cols = torch.arange(n_k, device=q.device)[None, :]
        visible = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device)
        if plan.causal:
            visible &= cols <= rows
        if window >= 0:
            visible &= cols >= rows - window
        attended = attention_fp64(q[first:end].transpose(0, 1)[None], k.transpose(0, 1)[None],
                                  v.transpose(0, 1)[None], scale, visible, softcap=plan.logits_soft_cap or 0.0,
                                  sinks=sinks)
        result[first:end] = attended[0].transpose(0, 1).to(q.dtype)
    if out is not None:
        out.copy_(result)
        result = out
    return (result, torch.zeros(q.shape[0], q.shape[1], device=q.device)) if return_lse else result


def paged_keys(plan, k_pages, v_pages):
    def keys_of(b):
        pages = plan.indices[plan.indptr[b]:plan.indptr[b + 1]]
        count = (pages.numel() - 1) * k_pages.shape[1] + int(plan.last_page_len[b]) if pages.numel() else 0
        return k_pages[pages].flatten(0, 1)[:count], v_pages[pages].flatten(0, 1)[:count]

    return keys_of
