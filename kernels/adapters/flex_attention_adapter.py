"""flex-attention: torch's `torch.nn.attention.flex_attention.flex_attention`, compiled with
torch.compile (its fused Triton kernel on CUDA; without compilation torch runs an unfused reference).

Written against torch 2.11 (torch/nn/attention/flex_attention.py): flex_attention(query, key, value,
score_mod=None, block_mask=None, scale=None, enable_gqa=False, return_lse=False,
kernel_options=None) on (batch, heads, seq, head_dim) tensors, and create_block_mask(mask_mod, B, H,
Q_LEN, KV_LEN, device). Mapping:
- causal: a mask_mod keeping kv_idx <= q_idx + offset, offset 0 (top-left) or seq_kv - seq_q
  (bottom-right), in a block mask, so that hidden blocks are skipped;
- bool masks: read by the mask_mod (True = may attend), and so part of the block mask; the block
  mask has a batch or head dim only where the mask varies over it;
- float masks: a score_mod adding mask[b, h, q_idx, kv_idx] to the scaled score;
- GQA: enable_gqa=True with K and V as they are; head_dim_vo may differ (only Q and K must agree).
The block mask (and score_mod) is built in prepare(), so that its cost is preparation. flex_attention
is compiled per (device, dtype, head dims, mask kind, causality) and specialised to each shape, as a
model that runs one shape gets it and as do_bench of the compiled call measures it (compiled with
dynamic shapes it read 1.11-1.27x do_bench's on an H100, bench/results/2026-11-27-h100-adapters/);
create_block_mask (which otherwise materialises a (B, H, seq_q, seq_kv) grid), preparation, is
compiled with dynamic shapes. The first run of each call, where a compilation happens, is
warm_up(), whose time attnreplay reports apart as compile_s. `compile=False`
(constructor argument or attribute) runs both uncompiled: the tests do, on the CPU.

Declines: dtypes other than fp16, bf16, fp32; on CUDA, head dims below 16 (Triton's tl.dot minimum,
torch/_inductor/kernel/flex/flex_attention.py).
"""

import dataclasses
from typing import Any, Callable, Optional

import torch

import attnreplay_plugin as ar
from _adapter_common import as_4d, causal_offset, leading_dims_vary

flex = ar.optional_import("torch.nn.attention.flex_attention", kernels=["flex-attention"])

# Past dynamo's recompile limit (8 per function by default) torch would quietly run later
# compilations through the unfused eager path: a replay of many kinds of call gets a higher limit.
RECOMPILE_LIMIT = 256


@dataclasses.dataclass
class FlexInputs:
    q: Any
    k: Any
    v: Any
    block_mask: Any
    score_mod: Optional[Callable]
    spec: Any
    mask: Any


class FlexAttention(ar.Kernel):
    name = "flex-attention"
    summary = "torch flex_attention, torch.compile'd, with a block mask for causal and bool masks"
    # flex_attention() is the call; the block mask prepare() builds is made once and reused by a model.
    headline = "run"
    layout = "bhsd"
    dtypes = ("float16", "bfloat16", "float32")
    native_gqa = True
    different_vo = True
    masks = ("bool", "float")
    causal_alignments = ("top_left", "bottom_right")

    def __init__(self, compile: bool = True):
        self.compile = compile
        # (flex_attention, create_block_mask) compiled per kind of call, on first use.
        self._compiled = {}

    def _functions(self, spec, mask):
        if not self.compile:
            return flex.flex_attention, flex.create_block_mask
        kind = (spec.device, spec.dtype, spec.head_dim_qk, spec.head_dim_vo,
                None if mask is None else str(mask.dtype), spec.is_causal, spec.causal_alignment)
        if kind not in self._compiled:
            import torch._dynamo

            config = torch._dynamo.config
            for limit in ("recompile_limit", "cache_size_limit"):
                if hasattr(config, limit):
                    setattr(config, limit, max(getattr(config, limit), RECOMPILE_LIMIT))
            self._compiled[kind] = (torch.compile(flex.flex_attention, dynamic=False),
                                    torch.compile(flex.create_block_mask, dynamic=True))
        return self._compiled[kind]

    def supports(self, spec):
        if spec.device == "cuda" and min(spec.head_dim_qk, spec.head_dim_vo) < 16:
            return (f"head dims ({spec.head_dim_qk}, {spec.head_dim_vo}) below 16 are not supported by flex "
                    f"attention's compiled kernel")
        return None

    def prepare(self, inputs):
        spec = inputs.spec
        _, create_block_mask = self._functions(spec, inputs.mask)
        device = inputs.q.device
        offset = causal_offset(spec)
        mask = inputs.mask
        full = (spec.batch, spec.heads_q, spec.seq_q, spec.seq_kv)
        score_mod = None
        batch_dim, head_dim = None, None
        if mask is not None and mask.dtype == torch.bool:
            visible = as_4d(mask).expand(full)
            varies_over_batch, varies_over_heads = leading_dims_vary(spec)
            batch_dim = spec.batch if varies_over_batch else None
            head_dim = spec.heads_q if varies_over_heads else None
            if spec.is_causal:
                def mask_mod(b, h, q_idx, kv_idx):
                    return visible[b, h, q_idx, kv_idx] & (kv_idx <= q_idx + offset)
            else:
                def mask_mod(b, h, q_idx, kv_idx):
                    return visible[b, h, q_idx, kv_idx]
        elif spec.is_causal:
            def mask_mod(b, h, q_idx, kv_idx):
                return kv_idx <= q_idx + offset
        else:
            mask_mod = None
        if mask is not None and mask.dtype != torch.bool:
            bias = as_4d(mask).expand(full)

            def score_mod(score, b, h, q_idx, kv_idx):
                return score + bias[b, h, q_idx, kv_idx]
        block_mask = (create_block_mask(mask_mod, batch_dim, head_dim, spec.seq_q, spec.seq_kv, device=device)
                      if mask_mod is not None else None)
        return FlexInputs(inputs.q, inputs.k, inputs.v, block_mask, score_mod, spec, inputs.mask)

    def warm_up(self, prepared):
        if not self.compile:
            return False
        self.run(prepared)
        return True

    def run(self, prepared):
        spec = prepared.spec
        flex_attention, _ = self._functions(spec, prepared.mask)
        return flex_attention(prepared.q, prepared.k, prepared.v, score_mod=prepared.score_mod,
                              block_mask=prepared.block_mask, scale=spec.scale, enable_gqa=spec.is_gqa)


if flex is not None:
    ar.register(FlexAttention())
