"""xformers: `xformers.ops.memory_efficient_attention` (PyPI `xformers`), with xFormers' own
dispatcher picking the operator (cutlass, flash, ...) as a model's call would.

Written against xformers 0.0.35 (xformers/ops/fmha/__init__.py, common.py, cutlass.py,
attn_bias.py; later versions re-export the same API from `mslk`): memory_efficient_attention(query,
key, value, attn_bias=None, p=0.0, scale=None, *, op=None, output_dtype=None) on BMHK tensors
(batch, seq, heads, head_dim), i.e. bshd. Mapping:
- causal: `LowerTriangularMask` (top-left) or `LowerTriangularFromBottomRightMask` (bottom-right);
- masks: a tensor bias of exactly (batch, heads, seq_q, seq_kv) in the query's dtype, a bool mask
  becoming 0 / -inf, with the causal diagonal folded in when both are present; its storage is
  padded so that every stride but the last is a multiple of 8 elements (xFormers' alignment check,
  128 bits of fp16/bf16), its broadcast dims are stride-0 views;
- GQA: the 5-dim BMGHK form, Q as (batch, seq, heads_kv, group, d) and K, V as
  (batch, seq, heads_kv, 1, d) expanded over the group (views; xFormers does not broadcast itself).
  With a mask as well, K and V are expanded to heads_q in prepare() (a copy) and the 4-dim form is
  used, the tensor-bias shape rule above being stated for BMHK only;
- head_dim_vo may differ from head_dim_qk (cutlass's SUPPORTS_DIFFERENT_VALUE_EMBED).
Dtypes fp16, bf16, fp32. On sm80+ the cutlass operator wants head dims that are multiples of
128 bits (8 for fp16/bf16, 4 for fp32; cutlass.py's _minimum_gemm_alignment).

Declines: other dtypes, head dims not a multiple of that alignment.
"""

import dataclasses
from typing import Any

import attnreplay_plugin as ar
from _adapter_common import additive_bias

xops = ar.optional_import("xformers.ops", kernels=["xformers"])
attn_bias = ar.optional_import("xformers.ops.fmha.attn_bias", kernels=["xformers"]) if xops is not None else None
xformers_package = ar.optional_import("xformers", kernels=["xformers"]) if xops is not None else None


@dataclasses.dataclass
class XformersInputs:
    q: Any
    k: Any
    v: Any
    bias: Any
    output_shape: tuple
    spec: Any


def aligned_bias(bias, batch: int, heads: int, seq_q: int, seq_kv: int):
    """`bias` (4-D, broadcastable) as a (batch, heads, seq_q, seq_kv) view whose non-last strides are
    multiples of 8: its own batch and head dims are kept (size 1 broadcast by stride 0)."""
    padded_kv = -(-seq_kv // 8) * 8
    storage = bias.new_empty((bias.shape[0], bias.shape[1], seq_q, padded_kv))
    storage[..., :seq_kv] = bias
    return storage[..., :seq_kv].expand(batch, heads, seq_q, seq_kv)


class XformersMemoryEfficient(ar.Kernel):
    name = "xformers"
    summary = "xformers.ops.memory_efficient_attention, xFormers' dispatcher (BMHK, BMGHK for GQA)"
    # memory_efficient_attention() is the call; the bias prepare() builds is the model's to pass.
    headline = "run"
    layout = "bshd"
    dtypes = ("float16", "bfloat16", "float32")
    native_gqa = True
    different_vo = True
    masks = ("bool", "float")
    causal_alignments = ("top_left", "bottom_right")

    def supports(self, spec):
        alignment = 4 if spec.dtype == "float32" else 8
        if spec.device == "cuda" and (spec.head_dim_qk % alignment or spec.head_dim_vo % alignment):
            return (f"head dims ({spec.head_dim_qk}, {spec.head_dim_vo}) must be multiples of {alignment} for "
                    f"{spec.dtype} (xFormers' cutlass operator reads 128-bit aligned rows)")
        return None

    def prepare(self, inputs):
        spec = inputs.spec
        q, k, v = inputs.q, inputs.k, inputs.v
        batch, seq_q, heads, _ = q.shape
        output_shape = (batch, seq_q, heads, spec.head_dim_vo)
        if inputs.mask is not None:
            bias = aligned_bias(additive_bias(inputs.mask, spec, q.dtype), batch, heads, spec.seq_q, spec.seq_kv)
            if spec.is_gqa:
                group = spec.heads_q // spec.heads_kv
                k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
            return XformersInputs(q, k, v, bias, output_shape, spec)
        if spec.is_causal:
            bias = (attn_bias.LowerTriangularMask() if spec.causal_alignment == "top_left"
                    else attn_bias.LowerTriangularFromBottomRightMask())
        else:
            bias = None
        if spec.is_gqa:
            group = spec.heads_q // spec.heads_kv
            q = q.view(batch, seq_q, spec.heads_kv, group, spec.head_dim_qk)
            k = k.unsqueeze(3).expand(-1, -1, -1, group, -1)
            v = v.unsqueeze(3).expand(-1, -1, -1, group, -1)
        return XformersInputs(q, k, v, bias, output_shape, spec)

    def run(self, prepared):
        try:
            out = xops.memory_efficient_attention(prepared.q, prepared.k, prepared.v, attn_bias=prepared.bias, p=0.0,
                                                  scale=prepared.spec.scale)
        except NotImplementedError as error:
            # Its dispatcher found no operator for these inputs (or none loaded: a wheel built for
            # another torch): xFormers' own no, not a fault.
            first = str(error).strip().splitlines()[0] if str(error).strip() else "no operator"
            why = ""
            if xformers_package is not None and getattr(xformers_package, "_has_cpp_library", True) is False:
                why = " (its C++/CUDA extensions did not load: the wheel was built for another torch)"
            raise ar.NotSupported(f"xFormers: {first.rstrip(': ')}{why}") from error
        return out.reshape(prepared.output_shape)


if xops is not None and attn_bias is not None:
    ar.register(XformersMemoryEfficient())
