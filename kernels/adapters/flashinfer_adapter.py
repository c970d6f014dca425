"""FlashInfer (PyPI `flashinfer-python`), its backend chosen by FlashInfer (backend="auto": fa2 or
fa3 by GPU):

- flashinfer-prefill: `flashinfer.single_prefill_with_kv_cache`, the prefill kernel for one request;
- flashinfer-decode: `flashinfer.BatchDecodeWithPagedKVCacheWrapper`, a batch of decode steps (one
  query row a sequence) over a paged KV cache;
- flashinfer-batch-prefill: `flashinfer.BatchPrefillWithPagedKVCacheWrapper` for a paged batch,
  `flashinfer.BatchPrefillWithRaggedKVCacheWrapper` for a batch of packed keys.

Written against flashinfer 0.6.18 (flashinfer/prefill.py, flashinfer/decode.py, flashinfer/page.py).

single_prefill_with_kv_cache(q, k, v, scale_q=None, scale_k=None, scale_v=None, o_dtype=None,
custom_mask=None, packed_custom_mask=None, causal=False, kv_layout="NHD", pos_encoding_mode="NONE",
use_fp16_qk_reduction=False, sm_scale=None, ..., backend="auto", return_lse=False) on q (qo_len,
heads_q, head_dim) and, in the "NHD" layout, k and v (kv_len, heads_kv, head_dim): one sequence, no
batch dim. The call's bshd tensors are passed as their batch-0 views. GQA is native. Its causal mask
keeps key j for query i when j <= i + kv_len - qo_len (bottom-right; the docstring's example builds
it with tril(diagonal=kv_len - qo_len)). A bool mask becomes FlashInfer's custom mask, (qo_len,
kv_len), True = may attend, shared by every head, with the causal diagonal folded in (causal is
ignored when a custom mask is given); prepare() packs it once with flashinfer.packbits(...,
bitorder="little"), as the call would on every run, and passes it as packed_custom_mask.

The batch wrappers, as their docstrings and examples use them: a wrapper on a float workspace
(128 MB, zeroed for its first use, on the inputs' device; prepare() allocates one per device on first
use and every wrapper shares it, as an engine's wrappers share theirs), plan() once for a batch (the
page table, lengths, heads, head dim, dtypes, sm_scale, causal, window_left, logits_soft_cap), then
run() once per layer. Their "NHD" paged cache is a (k_pages, v_pages) tuple, each (pages, page_size,
heads_kv, head_dim): attnreplay's pages as they are. Sequence b's keys are the pages
indices[indptr[b]:indptr[b+1]] in order, the last holding last_page_len[b] keys, documented as
1 <= last_page_len <= page_size (a full last page is page_size, not 0). plan() copies indptr,
last_page_len and qo_indptr to the host and indices to the workspace's device, so prepare() builds
them on the host, int32 as documented: for a paged call, each sequence's first ceil(seqused_k /
page_size) block-table entries; for packed keys, pages of one row each (a view of k and v; SGLang
reads its token-level KV pool so), which is how the decode wrapper takes packed keys and the paged
prefill wrapper takes packed keys that seqused_k leaves partly unused (kv_indptr cannot skip rows).
Packed keys used whole go to the ragged wrapper, kv_indptr = cu_seqlens_k. qo_indptr is
cu_seqlens_q. plan() takes q_data_type (default float16) and kv_data_type, and run() raises for q
or k of other dtypes, so both are passed. The decode wrapper is built with use_tensor_cores (the
prefill kernels) when more than 4 query heads share a KV head, vLLM's rule; its CUDA-core kernel is
dispatched for group sizes 1, 2, 3, 4, 6 and 8 only. The prefill wrappers' causal flag is
bottom-right within each sequence, as single_prefill's; the decode wrapper has none, and a single
query row sees all its sequence's keys bottom-right. sm_scale is always passed, and so are
window_left and logits_soft_cap.

Windows and softcaps, every kernel: window_left (-1: none) keeps key j for query i when j >= i +
kv_len - qo_len - window_left, bottom-right within each sequence whatever the causal flag, and there
is no right window: the right side is the causal diagonal or unbounded. A call's right window is
therefore taken only where it hides nothing beyond that: the call is causal, or window_right >=
seq_q - 1 in every sequence (query i's bound i + seq_kv - seq_q + right is then past the last key).
logits_soft_cap c turns each scaled score x into c * tanh(x / c). ALiBi: FlashInfer's
pos_encoding_mode="ALIBI" computes its own slopes from the head count, not the call's, so none is
taken. Sinks: run() takes them only for some backends (trtllm-gen; the cute-dsl one as a plan-time
variant), not the fa2/fa3 ones backend="auto" picks, so none are taken.

Declines, every kernel: dtypes other than fp16 and bf16; head dims other than 64, 128, 256 (a
cautious choice: FlashInfer compiles other head dims, and head_dim_vo != head_dim_qk, through its JIT,
which this adapter has not been tried with); head_dim_vo != head_dim_qk; top-left causal calls with
seq_q != seq_kv (in any sequence, for the batches). flashinfer-prefill: batch > 1 (attnreplay hands it
a ragged batch one sequence at a time, each a batch of one); float masks (FlashInfer takes none); bool
masks that differ between heads or batch entries. flashinfer-decode and flashinfer-batch-prefill:
dense calls; a sequence without keys whose keys go through a paged wrapper (its last_page_len would
be 0; the ragged wrapper takes an empty segment). flashinfer-decode: a sequence with other than one
query row. Every kernel: a window aligned top-left with seq_q != seq_kv (in any sequence); a right
window that hides keys (above); ALiBi; sinks. flashinfer-prefill: a window with a mask (FlashInfer's
custom mask beside window_left has not been tried here).
"""

import dataclasses
import math
from typing import Any

import torch

import attnreplay_plugin as ar
from _adapter_common import bottom_right_problem, leading_dims_vary, visible_keys

flashinfer = ar.optional_import("flashinfer", kernels=["flashinfer-prefill", "flashinfer-decode",
                                                       "flashinfer-batch-prefill"])

# FlashInfer's recommended float workspace for its batch wrappers.
WORKSPACE_BYTES = 128 * 1024 * 1024
# vLLM's rule for the decode wrapper: tensor cores (the prefill kernels) above 4 query heads a KV head.
TENSOR_CORE_GROUP_ABOVE = 4


def window_problem(spec):
    """Why FlashInfer cannot take the call's window, or None (the module's docstring)."""
    right = spec.window_right
    if right is not None and not spec.is_causal and any(right < q - 1 for q, _ in spec.sequence_lengths):
        return (f"window_right {right}: FlashInfer takes a left window only (window_left), and this one hides "
                f"keys from query rows beyond what causality would")
    return bottom_right_problem(spec, "FlashInfer")


def window_left(spec) -> int:
    return -1 if spec.window_left is None else spec.window_left


@dataclasses.dataclass
class PrefillInputs:
    q: Any
    k: Any
    v: Any
    packed_custom_mask: Any
    spec: Any


class FlashInferPrefill(ar.Kernel):
    name = "flashinfer-prefill"
    summary = "FlashInfer single_prefill_with_kv_cache (one sequence, NHD, native GQA)"
    # single_prefill_with_kv_cache() is the call; the packed mask prepare() builds is made once a batch.
    headline = "run"
    layout = "bshd"
    dtypes = ("float16", "bfloat16")
    head_dims = (64, 128, 256)
    native_gqa = True
    masks = ("bool",)
    causal_alignments = ("bottom_right",)
    extensions = ("window", "softcap")

    def supports(self, spec):
        if spec.batch != 1:
            return (f"batch {spec.batch} > 1: single_prefill_with_kv_cache takes one sequence (no batch dim); "
                    f"flashinfer-batch-prefill and flashinfer-decode take ragged and paged batches")
        if spec.mask_kind is not None and any(leading_dims_vary(spec)):
            return (f"a mask of shape {tuple(spec.mask_shape)} differs between heads or batch entries; FlashInfer's "
                    f"custom_mask is one (seq_q, seq_kv) mask for every head")
        if spec.mask_kind is not None and (spec.window_left is not None or spec.window_right is not None):
            return "a sliding window with a mask: FlashInfer's custom mask beside window_left is not tried here"
        return window_problem(spec)

    def prepare(self, inputs):
        spec = inputs.spec
        q, k, v = inputs.q[0], inputs.k[0], inputs.v[0]
        packed = None
        if inputs.mask is not None:
            visible = visible_keys(inputs.mask, spec)[0, 0].expand(spec.seq_q, spec.seq_kv).contiguous()
            packed = flashinfer.packbits(visible.reshape(-1), bitorder="little")
        return PrefillInputs(q, k, v, packed, spec)

    def run(self, prepared):
        spec = prepared.spec
        out = flashinfer.single_prefill_with_kv_cache(
            prepared.q, prepared.k, prepared.v, packed_custom_mask=prepared.packed_custom_mask,
            causal=spec.is_causal and prepared.packed_custom_mask is None, kv_layout="NHD", sm_scale=spec.scale,
            window_left=window_left(spec), logits_soft_cap=spec.softcap)
        return out.unsqueeze(0)


_workspaces = {}


def workspace_on(device) -> torch.Tensor:
    """The batch wrappers' float workspace on `device`, allocated on first use and then shared by every
    wrapper there, as an engine allocates one at start-up for all its wrappers: a fresh one for each
    plan() would add a 128 MB memset to the set-up's time, which no engine pays per step."""
    device = torch.device(device)
    if device not in _workspaces:
        _workspaces[device] = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _workspaces[device]


@dataclasses.dataclass
class PageTable:
    """The paged KV cache as FlashInfer's paged wrappers take it: the pages (NHD) and, on the host, int32
    indptr (batch + 1), indices (the pages used, in order) and last_page_len (batch)."""
    k_pages: Any
    v_pages: Any
    page_size: int
    indptr: torch.Tensor
    indices: torch.Tensor
    last_page_len: torch.Tensor


def page_table(inputs) -> PageTable:
    """The call's keys as a paged cache: a paged call's own pages through its block table, or packed
    keys as pages of one row (each sequence's first seqused_k rows from cu_seqlens_k)."""
    k_lens = list(inputs.spec.k_lens)
    if inputs.block_table is not None:
        page_size = inputs.spec.page_size
        counts = [math.ceil(n / page_size) for n in k_lens]
        table = inputs.block_table.cpu()
        indices = torch.cat([table[b, :count] for b, count in enumerate(counts)])
        k_pages, v_pages = inputs.k, inputs.v
    else:
        page_size = 1
        counts = k_lens
        starts = inputs.cu_seqlens_k.cpu().tolist()
        indices = torch.cat([torch.arange(start, start + n) for start, n in zip(starts, k_lens)])
        k_pages, v_pages = inputs.k.unsqueeze(1), inputs.v.unsqueeze(1)
    indptr = torch.tensor([0] + counts).cumsum(0)
    last_page_len = [n - (count - 1) * page_size for n, count in zip(k_lens, counts)]
    return PageTable(k_pages, v_pages, page_size, indptr.to(torch.int32), indices.to(torch.int32),
                     torch.tensor(last_page_len, dtype=torch.int32))


def keys_unused(spec) -> bool:
    """Whether a packed call's seqused_k leaves some sequence's keys partly unused (its keys then are
    not one contiguous run after another, which kv_indptr cannot say)."""
    return spec.page_size == 0 and sum(spec.k_lens) != spec.seq_kv


def sequence_without_keys(spec):
    """Why the paged wrappers cannot take the call's keys, or None: a sequence with none."""
    for b, n in enumerate(spec.k_lens):
        if n == 0:
            return (f"sequence {b} has no keys: FlashInfer's page table gives every sequence "
                    f"1 <= last_page_len <= page_size keys in its last page")
    return None


@dataclasses.dataclass
class PlannedBatch:
    """A planned wrapper and what run() hands it: q and the paged cache (k_pages, v_pages), or q, k, v."""
    wrapper: Any
    q: Any
    kv: tuple
    ragged: bool


def planned_options(spec) -> dict:
    """plan()'s keyword arguments beside the batch's layout, each set, none left to FlashInfer's defaults."""
    return dict(pos_encoding_mode="NONE", window_left=window_left(spec), logits_soft_cap=spec.softcap,
                sm_scale=spec.scale, q_data_type=spec.torch_dtype, kv_data_type=spec.torch_dtype)


class FlashInferBatchKernel(ar.Kernel):
    """What FlashInfer's batch wrappers share: ragged and paged batches, NHD, native GQA. Not registered."""
    # run() is the wrapper's run(), what a serving engine calls for every layer; prepare() is the page
    # table and plan(), which it does once a step for all layers.
    headline = "run"
    layout = "thd"
    paged = True
    dtypes = ("float16", "bfloat16")
    head_dims = (64, 128, 256)
    native_gqa = True
    causal_alignments = ("bottom_right",)
    extensions = ("window", "softcap")


class FlashInferDecode(FlashInferBatchKernel):
    name = "flashinfer-decode"
    summary = "FlashInfer BatchDecodeWithPagedKVCacheWrapper (decode over a paged KV cache, NHD, native GQA)"
    # (A single query row sees every key of its sequence bottom-right: causal hides nothing.)

    def supports(self, spec):
        rows = [b for b, n in enumerate(spec.q_lens) if n != 1]
        if rows:
            b = rows[0]
            return (f"sequence {b} has {spec.q_lens[b]} query rows ({len(rows)} of {len(spec.q_lens)} sequences have "
                    f"other than 1): BatchDecodeWithPagedKVCacheWrapper decodes one query row a sequence "
                    f"(flashinfer-batch-prefill takes the others)")
        return sequence_without_keys(spec) or window_problem(spec)

    def prepare(self, inputs):
        spec = inputs.spec
        table = page_table(inputs)
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace_on(inputs.q.device), kv_layout="NHD",
            use_tensor_cores=spec.heads_q // spec.heads_kv > TENSOR_CORE_GROUP_ABOVE)
        wrapper.plan(table.indptr, table.indices, table.last_page_len, spec.heads_q, spec.heads_kv, spec.head_dim_qk,
                     table.page_size, **planned_options(spec))
        return PlannedBatch(wrapper, inputs.q, (table.k_pages, table.v_pages), ragged=False)

    def run(self, prepared):
        return prepared.wrapper.run(prepared.q, prepared.kv)


class FlashInferBatchPrefill(FlashInferBatchKernel):
    name = "flashinfer-batch-prefill"
    summary = ("FlashInfer BatchPrefillWithPagedKVCacheWrapper (paged) / BatchPrefillWithRaggedKVCacheWrapper "
               "(packed keys), NHD, native GQA")

    def supports(self, spec):
        if spec.page_size or keys_unused(spec):
            problem = sequence_without_keys(spec)
            if problem:
                return problem
        return window_problem(spec)

    def prepare(self, inputs):
        spec = inputs.spec
        options = planned_options(spec)
        workspace = workspace_on(inputs.q.device)
        qo_indptr = inputs.cu_seqlens_q.cpu()
        if inputs.block_table is None and not keys_unused(spec):
            wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, kv_layout="NHD")
            wrapper.plan(qo_indptr, inputs.cu_seqlens_k.cpu(), spec.heads_q, spec.heads_kv, spec.head_dim_qk,
                         causal=spec.is_causal, **options)
            return PlannedBatch(wrapper, inputs.q, (inputs.k, inputs.v), ragged=True)
        table = page_table(inputs)
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, kv_layout="NHD")
        wrapper.plan(qo_indptr, table.indptr, table.indices, table.last_page_len, spec.heads_q, spec.heads_kv,
                     spec.head_dim_qk, table.page_size, causal=spec.is_causal, **options)
        return PlannedBatch(wrapper, inputs.q, (table.k_pages, table.v_pages), ragged=False)

    def run(self, prepared):
        if prepared.ragged:
            return prepared.wrapper.run(prepared.q, *prepared.kv)
        return prepared.wrapper.run(prepared.q, prepared.kv)


if flashinfer is not None:
    ar.register(FlashInferPrefill())
    ar.register(FlashInferDecode())
    ar.register(FlashInferBatchPrefill())
