"""transformer-engine: Transformer Engine's `transformer_engine.pytorch.DotProductAttention`
(PyPI `transformer_engine[pytorch]`), with TE's own backend selection (flash-attn, cuDNN fused
attention or its unfused path) as a model's call would get.

Written against Transformer Engine 2.20.0.dev0 (transformer_engine/pytorch/attention/
dot_product_attention/dot_product_attention.py): DotProductAttention(num_attention_heads,
kv_channels, num_gqa_groups=None, attention_dropout=0.0, qkv_format="sbhd", attn_mask_type="causal",
..., attention_type="self", ..., softmax_scale=None, ...), forward(query_layer, key_layer,
value_layer, attention_mask=None, ...). With qkv_format "bshd" it takes (batch, seq, heads, head_dim)
tensors and returns (batch, seq_q, heads_q * head_dim_vo), reshaped here to (batch, seq_q, heads_q,
head_dim_vo). Mapping: attn_mask_type "no_mask", "causal" (top-left) or "causal_bottom_right" (since
TE 1.9); num_gqa_groups = heads_kv (native GQA); kv_channels = head_dim, or (head_dim_qk,
head_dim_vo) when they differ (since TE 1.10); softmax_scale always passed; attention_dropout 0;
attention_type "cross" when seq_q != seq_kv (TE switches to it itself too). A bool mask is passed as
attn_mask_type "arbitrary" with TE's convention inverted (TE: True = masked out), 4-D, with the
causal diagonal folded in (there is no causal + arbitrary mask type). The module, which holds no
weights, is built once per call configuration and kept.

Declines: dtypes other than fp16 and bf16 (those of TE's flash-attn and cuDNN backends; whether its
unfused path takes fp32 was not checked); float masks (TE takes additive biases only as
core_attention_bias of restricted shapes, not mapped here).
"""

import dataclasses
from typing import Any

import attnreplay_plugin as ar
from _adapter_common import version_tuple, visible_keys

transformer_engine = ar.optional_import("transformer_engine", kernels=["transformer-engine"])
te_pytorch = (ar.optional_import("transformer_engine.pytorch", kernels=["transformer-engine"])
              if transformer_engine is not None else None)


@dataclasses.dataclass
class TeInputs:
    module: Any
    q: Any
    k: Any
    v: Any
    attention_mask: Any
    spec: Any


class TransformerEngineAttention(ar.Kernel):
    name = "transformer-engine"
    summary = "Transformer Engine DotProductAttention (bshd, TE's backend selection)"
    # The module's forward is the call; prepare() builds the module (cached) and its mask.
    headline = "run"
    layout = "bshd"
    dtypes = ("float16", "bfloat16")
    native_gqa = True
    different_vo = True
    masks = ("bool",)
    causal_alignments = ("top_left", "bottom_right")

    def __init__(self):
        self._modules = {}
        version = version_tuple(getattr(transformer_engine, "__version__", ""))
        if version and version < (1, 10):
            self.different_vo = False
        if version and version < (1, 9):
            self.causal_alignments = ("top_left",)

    def _module(self, spec, mask_type: str):
        d, dv = spec.head_dim_qk, spec.head_dim_vo
        key = (spec.heads_q, spec.heads_kv, d, dv, mask_type, spec.scale, spec.seq_q == spec.seq_kv)
        module = self._modules.get(key)
        if module is None:
            module = te_pytorch.DotProductAttention(
                num_attention_heads=spec.heads_q, kv_channels=d if d == dv else (d, dv),
                num_gqa_groups=spec.heads_kv, attention_dropout=0.0, qkv_format="bshd", attn_mask_type=mask_type,
                attention_type="self" if spec.seq_q == spec.seq_kv else "cross", softmax_scale=spec.scale)
            module.eval()
            self._modules[key] = module
        return module

    def prepare(self, inputs):
        spec = inputs.spec
        attention_mask = None
        if inputs.mask is not None:
            mask_type = "arbitrary"
            attention_mask = ~visible_keys(inputs.mask, spec)
        elif spec.is_causal:
            mask_type = "causal" if spec.causal_alignment == "top_left" else "causal_bottom_right"
        else:
            mask_type = "no_mask"
        return TeInputs(self._module(spec, mask_type), inputs.q, inputs.k, inputs.v, attention_mask, spec)

    def run(self, prepared):
        spec = prepared.spec
        out = prepared.module(prepared.q, prepared.k, prepared.v, attention_mask=prepared.attention_mask)
        return out.view(spec.batch, spec.seq_q, spec.heads_q, spec.head_dim_vo)


if te_pytorch is not None:
    ar.register(TransformerEngineAttention())
