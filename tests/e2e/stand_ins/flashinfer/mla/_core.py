"""Test stand-in, not FlashInfer: BatchMLAPagedAttentionWrapper with FlashInfer's signatures
(flashinfer/mla/_core.py): DeepSeek's MLA with the matrices absorbed, decode or incremental
prefill over a paged cache of compressed keys (ckv) and their rope part (kpe). Sequence b's queries
qo_indptr[b]..qo_indptr[b+1] attend, with one key head shared by every query head, to the first
kv_len_arr[b] tokens of the pages kv_indices[kv_indptr[b]..kv_indptr[b+1]]: scores from
[q_nope, q_pe]·[ckv, kpe], values ckv. FP8 caches and the cutlass backend's run-time page table
raise."""
import torch

from .._batch import PagedPlan, index_copy, paged_keys, run_batch


class BatchMLAPagedAttentionWrapper:
    def __init__(self, float_workspace_buffer, use_cuda_graph=False, qo_indptr=None, kv_indptr=None,
                 kv_indices=None, kv_len_arr=None, backend="auto"):
        self._plan = None

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe, page_size,
             causal, sm_scale, q_data_type, kv_data_type, use_profiler=False):
        counts = kv_indptr[1:] - kv_indptr[:-1]
        last = torch.where(counts > 0, kv_len_arr - (counts - 1) * page_size, torch.zeros_like(counts))
        self._plan = PagedPlan(index_copy(qo_indptr), index_copy(kv_indptr), index_copy(kv_indices),
                               index_copy(last), bool(causal), -1, None, sm_scale)

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse=False, profiler_buffer=None,
            kv_len=None, page_table=None, return_lse_base_on_e=False, o_scale=None, *, ckv_scale=None,
            ckv_scale_arr=None, kpe_scale=None):
        if any(x is not None for x in (kv_len, page_table, o_scale, ckv_scale, ckv_scale_arr, kpe_scale)):
            raise NotImplementedError("the stand-in runs the fa2 backend's bf16/fp16 MLA only")
        q = torch.cat([q_nope, q_pe], dim=-1)
        keys = torch.cat([ckv_cache, kpe_cache], dim=-1).unsqueeze(2)  # (pages, page_size, 1, ckv + kpe)
        return run_batch(self._plan, q, paged_keys(self._plan, keys, ckv_cache.unsqueeze(2)), out=out,
                         return_lse=return_lse)
