"""flash-attn-3 and flash-attn-3-fp8: FlashAttention-3's `flash_attn_interface.flash_attn_func`
(the Hopper build of Dao-AILab/flash-attention, `hopper/`; package `flash_attn_3`).

Written against the flash-attention main branch of August 2026 (hopper/flash_attn_interface.py,
hopper/flash_api.cpp): flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None,
q_descale=None, k_descale=None, v_descale=None, window_size=(-1, -1), ..., return_attn_probs=False).
Since commit 203b9b3 ("Allow returning LSE via kwarg") it returns the output alone unless
return_attn_probs; before, it always returned (out, softmax_lse): both are accepted here. It takes
(batch, seq, heads, head_dim) tensors, K and V with fewer heads for GQA, bottom-right causal, and no
mask. Head dims: at most 256 and a multiple of 8 (16 for FP8); head_dim_vo may differ from
head_dim_qk only for head_dim_qk in (128, 192] with head_dim_vo in (96, 128], or head_dim_qk <= 64
with head_dim_vo <= 512, and on Hopper only (flash_api.cpp's checks).

flash-attn-3 runs bf16/fp16 inputs as they are. flash-attn-3-fp8 quantizes in prepare(): Q, K and V
to float8_e4m3fn, each divided by its scale amax/448, with the scales passed as FA3's descales,
which are per (batch, kv head) (`q_descale` is (batch, heads_kv), not (batch, heads_q)): under
--fp8_scale per_head each (batch, kv head) has its own scale (for Q: over the query heads that share
that kv head), under per_tensor one amax covers the whole tensor. Its output is bf16, as FA3's is for
FP8 inputs.

Windows and softcaps, both kernels (hopper/flash_api.cpp, mha_fwd): window_size (left, right), -1
unbounded, keeps key j for query i when i + seq_kv - seq_q - left <= j <= i + seq_kv - seq_q + right,
bottom-right whatever the causal flag, and causal sets right to 0 (the record's intersection); a left
>= seq_kv - 1 or right >= seq_q - 1 is made unbounded, which is what it is. softcap s turns each scaled
score x into s * tanh(x / s). No ALiBi, no sinks (flash_attn_func takes neither).

Declines: other dtypes; head dims outside the rules above; masks; top-left causal calls with seq_q !=
seq_kv; a window aligned top-left with seq_q != seq_kv; ALiBi; sinks; for FP8, head_dim_vo !=
head_dim_qk (not checked against FA3's FP8 instantiations).
"""

import dataclasses
from typing import Any, Optional

import torch

import attnreplay_plugin as ar
from _adapter_common import bottom_right_problem, flash_attn_window, gpu_capability, output_only

NAMES = ["flash-attn-3", "flash-attn-3-fp8"]
flash_attn_interface = ar.optional_import("flash_attn_interface", kernels=NAMES)

E4M3_MAX = 448.0


def head_dim_problem(spec, alignment: int, largest_vo: int) -> Optional[str]:
    d, dv = spec.head_dim_qk, spec.head_dim_vo
    if d > 256:
        return f"head_dim {d} is above 256, FlashAttention-3's largest"
    if d % alignment or dv % alignment:
        return f"head dims ({d}, {dv}) must be multiples of {alignment} for FlashAttention-3 with {spec.dtype}"
    if dv != d and not ((128 < d <= 192 and 96 < dv <= 128) or (d <= 64 and dv <= largest_vo)):
        return (f"head_dim_vo {dv} != head_dim_qk {d} is supported by FlashAttention-3 only for head_dim_qk in "
                f"(128, 192] with head_dim_vo in (96, 128], or head_dim_qk <= 64 with head_dim_vo <= {largest_vo}")
    return None


class FlashAttention3(ar.Kernel):
    name = "flash-attn-3"
    summary = "FlashAttention-3, flash_attn_interface.flash_attn_func (bshd, native GQA, Hopper)"
    layout = "bshd"
    dtypes = ("float16", "bfloat16")
    native_gqa = True
    different_vo = True
    causal_alignments = ("bottom_right",)
    extensions = ("window", "softcap")
    # (major, minor) of the GPU; None: asked of torch when needed. Tests set it.
    compute_capability = None

    def supports(self, spec):
        problem = head_dim_problem(spec, alignment=8, largest_vo=512)
        if problem is None and spec.head_dim_vo != spec.head_dim_qk and spec.device == "cuda":
            if gpu_capability(self)[0] != 9:
                return "head_dim_vo != head_dim_qk is supported by FlashAttention-3 on Hopper (sm90) only"
        return problem or bottom_right_problem(spec, "FlashAttention-3")

    def run(self, inputs):
        spec = inputs.spec
        return output_only(flash_attn_interface.flash_attn_func(
            inputs.q, inputs.k, inputs.v, softmax_scale=spec.scale, causal=spec.is_causal,
            window_size=flash_attn_window(spec, -1), softcap=spec.softcap))


def to_e4m3(x: torch.Tensor, heads_kv: int, granularity: str):
    """(x as float8_e4m3fn, its scale as a (batch, heads_kv) float32 descale) for x in bshd."""
    batch, seq, heads, dim = x.shape
    group = heads // heads_kv
    magnitude = x.abs().float()
    if granularity == "per_tensor":
        amax = magnitude.amax().expand(batch, heads_kv)
    else:
        amax = magnitude.view(batch, seq, heads_kv, group, dim).amax(dim=(1, 3, 4))
    # An all-zero group keeps scale 1 rather than dividing by zero; its codes are zeros either way.
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax)).contiguous()
    per_head = scale.repeat_interleave(group, dim=1)[:, None, :, None]
    # Rounding can land amax/scale a hair above 448, which float8_e4m3fn has no code for.
    codes = (x.float() / per_head).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return codes, scale


@dataclasses.dataclass
class Fp8Inputs:
    q: Any
    k: Any
    v: Any
    q_descale: Any
    k_descale: Any
    v_descale: Any
    spec: Any


class FlashAttention3Fp8(ar.Kernel):
    name = "flash-attn-3-fp8"
    summary = "FlashAttention-3 FP8 e4m3, Q/K/V quantized with per-(batch, kv head) descales (bshd, Hopper)"
    # flash_attn_func() on FP8 inputs is the call; the quantization prepare() does is the model's own.
    headline = "run"
    layout = "bshd"
    dtypes = ("float16", "bfloat16")
    native_gqa = True
    causal_alignments = ("bottom_right",)
    reduced_precision = "float8_e4m3fn"
    output_dtype = "bfloat16"
    extensions = ("window", "softcap")

    def supports(self, spec):
        if spec.quant.fp8_scale not in ("per_head", "per_tensor"):
            return f"--fp8_scale {spec.quant.fp8_scale} is not supported (takes per_head, per_tensor)"
        return head_dim_problem(spec, alignment=16, largest_vo=256) or bottom_right_problem(spec, "FlashAttention-3")

    def prepare(self, inputs):
        spec = inputs.spec
        granularity = spec.quant.fp8_scale
        q, q_descale = to_e4m3(inputs.q, spec.heads_kv, granularity)
        k, k_descale = to_e4m3(inputs.k, spec.heads_kv, granularity)
        v, v_descale = to_e4m3(inputs.v, spec.heads_kv, granularity)
        return Fp8Inputs(q, k, v, q_descale, k_descale, v_descale, spec)

    def run(self, prepared):
        spec = prepared.spec
        return output_only(flash_attn_interface.flash_attn_func(
            prepared.q, prepared.k, prepared.v, softmax_scale=spec.scale, causal=spec.is_causal,
            window_size=flash_attn_window(spec, -1), softcap=spec.softcap,
            q_descale=prepared.q_descale, k_descale=prepared.k_descale, v_descale=prepared.v_descale))


if flash_attn_interface is not None:
    ar.register(FlashAttention3())
    ar.register(FlashAttention3Fp8())
