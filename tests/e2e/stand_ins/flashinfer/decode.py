"""Test stand-in for flashinfer.decode, not the library: single_decode_with_kv_cache and
BatchDecodeWithPagedKVCacheWrapper with FlashInfer's signatures (0.6.18: plan takes its optional
arguments as **kwargs and hands them to _plan_impl), computed with torch in float64 on the CPU.
One query a request (q_len_per_req 1); _batch.py says what is computed and checked. As the real
wrapper does, window_right other than 0 raises (it is the cute-dsl backend's), and without
use_tensor_cores run() takes group sizes (query heads a KV head) 1, 2, 3, 4, 6 and 8 only, the ones
its CUDA-core kernel is dispatched for (DISPATCH_GQA_GROUP_SIZE)."""
import torch

from ._batch import (PagedPlan, as_torch_dtype, check_layout, check_page_lists, check_run, index_copy, pages_of,
                     paged_keys, record_plan, run_batch, unsupported)

# plan()'s optional arguments in their old positional order (deprecated there, still accepted).
_LEGACY_POSITIONAL = ("pos_encoding_mode", "window_left", "logits_soft_cap", "q_data_type", "kv_data_type",
                      "data_type", "sm_scale", "rope_scale", "rope_theta", "non_blocking")
CUDA_CORE_GROUP_SIZES = (1, 2, 3, 4, 6, 8)


class BatchDecodeWithPagedKVCacheWrapper:
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None):
        check_layout(kv_layout)
        self._kv_layout = kv_layout
        self._workspace_device = float_workspace_buffer.device
        self._use_tensor_cores = use_tensor_cores
        self._plan = None

    @property
    def use_tensor_cores(self):
        return self._use_tensor_cores

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             *deprecated_positional_args, **kwargs):
        kwargs.update(zip(_LEGACY_POSITIONAL, deprecated_positional_args))
        return self._plan_impl(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                               **kwargs)

    begin_forward = plan

    def _plan_impl(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
                   pos_encoding_mode="NONE", window_left=-1, window_right=0, logits_soft_cap=None,
                   q_data_type="float16", kv_data_type=None, o_data_type=None, data_type=None, sm_scale=None,
                   rope_scale=None, rope_theta=None, non_blocking=True, block_tables=None, seq_lens=None,
                   fixed_split_size=None, disable_split_kv=False, q_len_per_req=1):
        record_plan(self, {**locals(), "use_tensor_cores": self._use_tensor_cores})
        unsupported(pos_encoding_mode)
        if window_right != 0:
            raise NotImplementedError("BatchDecodeWithPagedKVCacheWrapper only supports window_right != 0 with "
                                      "backend='cute-dsl'")
        if q_len_per_req != 1:
            raise NotImplementedError("the stand-in decodes one query a request")
        check_page_lists(indptr, indices, last_page_len, page_size)
        if data_type is not None:
            q_data_type = data_type if q_data_type is None else q_data_type
            kv_data_type = data_type if kv_data_type is None else kv_data_type
        q_dtype = as_torch_dtype(q_data_type)
        kv_dtype = as_torch_dtype(kv_data_type) if kv_data_type is not None else q_dtype
        batch = indptr.numel() - 1
        self._group_size = num_qo_heads // num_kv_heads
        self._plan = PagedPlan(torch.arange(batch + 1), index_copy(indptr), index_copy(indices),
                               index_copy(last_page_len), False, window_left, logits_soft_cap, sm_scale, q_dtype,
                               kv_dtype)

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, window_left=None, sinks=None, q_len_per_req=None,
            skip_softmax_threshold_scale_factor=None, kv_cache_sf=None):
        unsupported(scales=(q_scale, k_scale, v_scale, kv_cache_sf))
        k_pages, v_pages = pages_of(paged_kv_cache, self._kv_layout)
        # The decode plan's qo_indptr is 0..batch: one row a request, which q must have.
        check_run(self._plan, self._workspace_device, q, k_pages)
        if not self._use_tensor_cores and self._group_size not in CUDA_CORE_GROUP_SIZES:
            raise RuntimeError(f"Unsupported group_size: {self._group_size}")
        return run_batch(self._plan, q, paged_keys(self._plan, k_pages, v_pages), window_left, sinks, out, return_lse)


def single_decode_with_kv_cache(q, k, v, kv_layout="NHD", pos_encoding_mode="NONE", use_tensor_cores=False,
                                q_scale=None, k_scale=None, v_scale=None, window_left=-1, logits_soft_cap=None,
                                sm_scale=None, rope_scale=None, rope_theta=None, return_lse=False):
    """q (heads_q, dim); k and v (kv_len, heads_kv, dim) in NHD."""
    check_layout(kv_layout)
    unsupported(pos_encoding_mode, scales=(q_scale, k_scale, v_scale))
    if kv_layout == "HND":
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    plan = PagedPlan(torch.tensor([0, 1]), None, None, None, False, window_left, logits_soft_cap, sm_scale)
    out = run_batch(plan, q[None], lambda b: (k, v), None, None, None, return_lse)
    return (out[0][0], out[1][0]) if return_lse else out[0]
