"""flash-attn-2: FlashAttention-2's `flash_attn.flash_attn_func` (PyPI `flash-attn`).

Written against flash-attn 2.8 (flash_attn/flash_attn_interface.py): flash_attn_func(q, k, v,
dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
alibi_slopes=None, deterministic=False, return_attn_probs=False) returns the output alone. It takes
(batch, seq, heads, head_dim) fp16 or bf16 tensors, K and V with fewer heads for GQA, head dims up
to 256 (padded to a multiple of 8 inside the call), and one head dim for Q, K and V. Its causal
diagonal is bottom-right since 2.1 (top-left before), so the alignment is read from the version.

Declines: other dtypes; head_dim > 256; head_dim_vo != head_dim_qk; masks (the function takes
none, only windows and ALiBi slopes); causal calls of the other alignment with seq_q != seq_kv.
"""

import attnreplay_plugin as ar
from _adapter_common import version_tuple

flash_attn = ar.optional_import("flash_attn", kernels=["flash-attn-2"])


class FlashAttention2(ar.Kernel):
    name = "flash-attn-2"
    summary = "FlashAttention-2, flash_attn.flash_attn_func (bshd, native GQA)"
    layout = "bshd"
    dtypes = ("float16", "bfloat16")
    native_gqa = True
    causal_alignments = ("bottom_right",)

    def __init__(self):
        version = version_tuple(getattr(flash_attn, "__version__", ""))
        # flash-attn 2.1 moved the causal diagonal from the top-left to the bottom-right corner.
        if version and version < (2, 1):
            self.causal_alignments = ("top_left",)

    def supports(self, spec):
        if spec.head_dim_qk > 256:
            return f"head_dim {spec.head_dim_qk} is above 256, FlashAttention-2's largest"
        return None

    def run(self, inputs):
        spec = inputs.spec
        return flash_attn.flash_attn_func(inputs.q, inputs.k, inputs.v, dropout_p=0.0, softmax_scale=spec.scale,
                                          causal=spec.is_causal)


if flash_attn is not None:
    # flash_attn is a namespace shared with FlashAttention-4 (flash_attn.cute): it can import with
    # FlashAttention-2 absent.
    if hasattr(flash_attn, "flash_attn_func"):
        ar.register(FlashAttention2())
    else:
        ar.unavailable("flash-attn-2", "flash_attn imports but has no flash_attn_func (FlashAttention-2 is not "
                                       "installed; only another package of the flash_attn namespace is)")
