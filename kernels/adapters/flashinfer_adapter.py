"""flashinfer-prefill: FlashInfer's `flashinfer.single_prefill_with_kv_cache` (PyPI
`flashinfer-python`), the prefill kernel for one request, its backend chosen by FlashInfer
(backend="auto": fa2 or fa3 by GPU).

Written against flashinfer 0.6.18 (flashinfer/prefill.py): single_prefill_with_kv_cache(q, k, v,
scale_q=None, scale_k=None, scale_v=None, o_dtype=None, custom_mask=None, packed_custom_mask=None,
causal=False, kv_layout="NHD", pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
sm_scale=None, ..., backend="auto", return_lse=False) on q (qo_len, heads_q, head_dim) and, in the
"NHD" layout, k and v (kv_len, heads_kv, head_dim): one sequence, no batch dim. The call's bshd
tensors are passed as their batch-0 views. GQA is native. Its causal mask keeps key j for query i
when j <= i + kv_len - qo_len (bottom-right; the docstring's example builds it with
tril(diagonal=kv_len - qo_len)). A bool mask becomes FlashInfer's custom mask, (qo_len, kv_len),
True = may attend, shared by every head, with the causal diagonal folded in (causal is ignored when
a custom mask is given); prepare() packs it once with flashinfer.packbits(..., bitorder="little"),
as the call would on every run, and passes it as packed_custom_mask.

Declines: batch > 1; dtypes other than fp16 and bf16; head dims other than 64, 128, 256 (a cautious
choice: FlashInfer compiles other head dims, and head_dim_vo != head_dim_qk, through its JIT, which
this adapter has not been tried with); head_dim_vo != head_dim_qk; float masks (FlashInfer takes none);
bool masks that differ between heads or batch entries; top-left causal calls with seq_q != seq_kv.
"""

import dataclasses
from typing import Any

import attnreplay_plugin as ar
from _adapter_common import leading_dims_vary, visible_keys

flashinfer = ar.optional_import("flashinfer", kernels=["flashinfer-prefill"])


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

    def supports(self, spec):
        if spec.batch != 1:
            return (f"batch {spec.batch} > 1: single_prefill_with_kv_cache takes one sequence (no batch dim); "
                    f"batches go through FlashInfer's BatchPrefill wrappers, which this adapter does not drive")
        if spec.mask_kind is not None and any(leading_dims_vary(spec)):
            return (f"a mask of shape {tuple(spec.mask_shape)} differs between heads or batch entries; FlashInfer's "
                    f"custom_mask is one (seq_q, seq_kv) mask for every head")
        return None

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
            causal=spec.is_causal and prepared.packed_custom_mask is None, kv_layout="NHD", sm_scale=spec.scale)
        return out.unsqueeze(0)


if flashinfer is not None:
    ar.register(FlashInferPrefill())
