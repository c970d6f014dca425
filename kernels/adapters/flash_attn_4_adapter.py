"""flash-attn-4: FlashAttention-4's `flash_attn.cute.interface.flash_attn_func` (PyPI
`flash-attn-4`, CuTe DSL kernels compiled at first use).

Written against flash-attention's flash_attn/cute/interface.py of 2026 (flash-attn-4 4.0 betas):
flash_attn_func(q, k, v, qv=None, ..., softmax_scale=None, causal=False, window_size=(None, None),
learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False, score_mod=None,
..., mask_mod=None, ..., return_lse=False) returns (out, lse) (lse None unless asked for), as every
version since the first has; a bare output is accepted too. It takes (batch, seq, heads, head_dim)
fp16 or bf16 tensors, K and V with fewer heads for GQA, and aligns the causal diagonal to the
bottom right (flash_attn/cute/mask.py). Head dims (interface.py's _validate_head_dims, 16-bit
inputs): multiples of 8; on Hopper (sm90) both in [8, 256]; on Blackwell (sm100/sm110) both in
[8, 128], or (192, 128), (256, 256), or head_dim_vo 512 with head_dim_qk 64 or 512.

Masks are CuTe DSL callables there (score_mod / mask_mod), not tensors, so none is taken.
Declines: other dtypes; head dims outside the rules above for the GPU's architecture; masks;
top-left causal calls with seq_q != seq_kv.
"""

import attnreplay_plugin as ar
from _adapter_common import gpu_capability, output_only

interface = ar.optional_import("flash_attn.cute.interface", kernels=["flash-attn-4"])


class FlashAttention4(ar.Kernel):
    name = "flash-attn-4"
    summary = "FlashAttention-4, flash_attn.cute.interface.flash_attn_func (bshd, native GQA)"
    layout = "bshd"
    dtypes = ("float16", "bfloat16")
    native_gqa = True
    different_vo = True
    causal_alignments = ("bottom_right",)
    # (major, minor) of the GPU; None: asked of torch on first use. Tests set it.
    compute_capability = None

    def _major(self):
        capability = gpu_capability(self)
        return capability[0] if capability else None

    def supports(self, spec):
        d, dv = spec.head_dim_qk, spec.head_dim_vo
        if d % 8 or dv % 8:
            return f"head dims ({d}, {dv}) must be multiples of 8 for FlashAttention-4"
        major = self._major()
        if major == 9 and not (8 <= d <= 256 and 8 <= dv <= 256):
            return f"head dims ({d}, {dv}) are outside [8, 256], FlashAttention-4's range on sm90"
        if major in (10, 11) and not ((d <= 128 and dv <= 128) or (d, dv) in ((192, 128), (256, 256))
                                      or (dv == 512 and d in (64, 512))):
            return (f"head dims ({d}, {dv}) are not supported by FlashAttention-4 on sm{major}0 (takes both <= 128, "
                    f"(192, 128), (256, 256), or head_dim_vo 512 with head_dim_qk 64 or 512)")
        if d != dv and major not in (9, 10, 11):
            return f"head_dim_vo {dv} != head_dim_qk {d} is supported by FlashAttention-4 on sm90 and sm100 only"
        return None

    def run(self, inputs):
        spec = inputs.spec
        return output_only(interface.flash_attn_func(inputs.q, inputs.k, inputs.v, softmax_scale=spec.scale,
                                                     causal=spec.is_causal))


if interface is not None:
    ar.register(FlashAttention4())
