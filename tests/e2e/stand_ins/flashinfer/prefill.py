"""Test stand-in for flashinfer.prefill, not the library: `single_prefill_with_kv_cache` and the batch
prefill wrappers with FlashInfer's signatures and conventions, computed with torch in float64 on the CPU.

Conventions followed (flashinfer 0.6.18, flashinfer/prefill.py, quantization/packbits.py): q (qo_len,
heads_q, head_dim) and, in kv_layout "NHD", k and v (kv_len, heads_kv, head_dim) ("HND": heads first);
one request, no batch dim; fp16 or bf16 (FP8 scales not emulated), heads_q a multiple of heads_kv;
causal keeps key j for query i when j <= i + kv_len - qo_len (bottom-right) and is ignored when a
custom mask is given; custom_mask bool (qo_len, kv_len), True = may attend, or packed_custom_mask, its
bits packed little-endian by packbits(x, bitorder="little") (which wins when both are given); returns
the output, or (output, lse) with return_lse. window_left (-1 none) keeps key j for query i when j >= i +
kv_len - qo_len - window_left (bottom-right, with or without causal or a custom mask); logits_soft_cap
c makes each scaled score x c·tanh(x / c). Positional encodings raise. The last call's arguments are
in LAST_CALL. The batch wrappers follow _batch.py.
"""
import torch

from _stand_in_math import attention_fp64, causal_visible, window_visible
from _stand_in_record import record

from ._batch import (PagedPlan, RaggedPlan, as_torch_dtype, check_layout, check_page_lists, check_run, index_copy,
                     pages_of, paged_keys, record_plan, run_batch, unsupported)
from .quantization import _unpack_little, packbits

LAST_CALL = {}


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
    if pos_encoding_mode != "NONE" or kv_cache_sf is not None:
        raise NotImplementedError("the stand-in does not emulate positional encodings or FP4 KV caches")
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
        visible = torch.ones(qo_len, kv_len, dtype=torch.bool)
    if window_left >= 0:
        visible = visible & window_visible(qo_len, kv_len, kv_len - qo_len, left=window_left)
    if sm_scale is None:
        sm_scale = head_dim ** -0.5
    out = attention_fp64(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], sm_scale, visible,
                         softcap=logits_soft_cap or 0.0)
    out = out[0].transpose(0, 1).to(o_dtype or q.dtype)
    return (out, torch.zeros(qo_len, heads)) if return_lse else out


class BatchPrefillWithPagedKVCacheWrapper:
    """Batch prefill over a paged KV cache (flashinfer.prefill, 0.6.18's signatures); _batch.py
    says what is computed and checked."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None,
                 custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None, jit_kwargs=None):
        check_layout(kv_layout)
        self._kv_layout = kv_layout
        self._workspace_device = float_workspace_buffer.device
        self._plan = None

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
             head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal=False,
             pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None, window_left=-1,
             logits_soft_cap=None, rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
             o_data_type=None, non_blocking=True, prefix_len_ptr=None, token_pos_in_items_ptr=None,
             token_pos_in_items_len=0, max_item_len_ptr=None, seq_lens=None, seq_lens_q=None, block_tables=None,
             max_token_per_sequence=None, max_sequence_kv=None, fixed_split_size=None, disable_split_kv=False):
        record_plan(self, locals())
        unsupported(pos_encoding_mode, custom_mask=custom_mask, packed_custom_mask=packed_custom_mask)
        check_page_lists(paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, page_size)
        q_dtype = as_torch_dtype(q_data_type)
        self._plan = PagedPlan(index_copy(qo_indptr), index_copy(paged_kv_indptr), index_copy(paged_kv_indices),
                               index_copy(paged_kv_last_page_len), causal, window_left, logits_soft_cap, sm_scale,
                               q_dtype, as_torch_dtype(kv_data_type) if kv_data_type is not None else q_dtype)

    begin_forward = plan

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, window_left=None, sinks=None, kv_cache_sf=None,
            skip_softmax_threshold_scale_factor=None, use_fp16_softmax=None, uses_spcompress=None):
        unsupported(scales=(q_scale, k_scale, v_scale, kv_cache_sf))
        k_pages, v_pages = pages_of(paged_kv_cache, self._kv_layout)
        check_run(self._plan, self._workspace_device, q, k_pages)
        return run_batch(self._plan, q, paged_keys(self._plan, k_pages, v_pages), window_left, sinks, out, return_lse)


class BatchPrefillWithRaggedKVCacheWrapper:
    """Batch prefill over packed keys (flashinfer.prefill, 0.6.18's signatures): k and v
    (kv_indptr[-1], heads_kv, dim) in NHD, (heads_kv, kv_indptr[-1], dim) in HND."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 kv_indptr_buf=None, custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None,
                 jit_kwargs=None):
        check_layout(kv_layout)
        self._kv_layout = kv_layout
        self._workspace_device = float_workspace_buffer.device
        self._plan = None

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None, custom_mask=None,
             packed_custom_mask=None, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
             window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None,
             q_data_type="float16", kv_data_type=None, o_data_type=None, non_blocking=True, prefix_len_ptr=None,
             token_pos_in_items_ptr=None, token_pos_in_items_len=0, max_item_len_ptr=None, fixed_split_size=None,
             disable_split_kv=False, seq_lens=None, seq_lens_q=None, max_token_per_sequence=None,
             max_sequence_kv=None, v_indptr=None, o_indptr=None):
        record_plan(self, locals())
        unsupported(pos_encoding_mode, custom_mask=custom_mask, packed_custom_mask=packed_custom_mask)
        if len(kv_indptr) != len(qo_indptr):
            raise ValueError("The kv_indptr length should be equal to mask_indptr length.")
        q_dtype = as_torch_dtype(q_data_type)
        kv_dtype = as_torch_dtype(kv_data_type) if kv_data_type is not None else q_dtype
        self._plan = RaggedPlan(index_copy(qo_indptr), index_copy(kv_indptr), causal, window_left, logits_soft_cap,
                                sm_scale, q_dtype, kv_dtype)

    begin_forward = plan

    def run(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, o_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, kv_cache_sf=None):
        unsupported(scales=(q_scale, k_scale, v_scale, o_scale, kv_cache_sf))
        check_run(self._plan, self._workspace_device, q, k)
        if self._kv_layout == "HND":
            k, v = k.transpose(0, 1), v.transpose(0, 1)
        starts = self._plan.kv_indptr

        def keys_of(b):
            return k[starts[b]:starts[b + 1]], v[starts[b]:starts[b + 1]]

        return run_batch(self._plan, q, keys_of, None, None, out, return_lse)
