"""flash-attn-2: FlashAttention-2's `flash_attn.flash_attn_func` (PyPI `flash-attn`).

Written against flash-attn 2.8 (flash_attn/flash_attn_interface.py): flash_attn_func(q, k, v,
dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
alibi_slopes=None, deterministic=False, return_attn_probs=False) returns the output alone. It takes
(batch, seq, heads, head_dim) fp16 or bf16 tensors, K and V with fewer heads for GQA, head dims up
to 256 (padded to a multiple of 8 inside the call), and one head dim for Q, K and V. Its causal
diagonal is bottom-right since 2.1 (top-left before), so the alignment is read from the version.

Windows, softcaps and ALiBi (flash_api.cpp, mha_fwd): window_size (left, right), -1 unbounded, keeps key
j for query i when i + seq_kv - seq_q - left <= j <= i + seq_kv - seq_q + right, and causal sets right
to 0, which is the record's intersection of both; softcap s turns each scaled score x into
s * tanh(x / s); alibi_slopes, fp32 (heads_q) or (batch, heads_q), subtracts slope * |i + seq_kv -
seq_q - j| after the softcap. All three are bottom-right whatever the causal flag. Without causal,
mha_fwd reads the right side its own way where seq_q > seq_kv: a side >= seq_kv is made unbounded, and
an unbounded right beside a bounded left becomes seq_kv, either of which can show early query rows
keys the call's window hides, or hide keys it shows (right_window_problem). No sinks.

Declines: other dtypes; head_dim > 256; head_dim_vo != head_dim_qk; masks (the function takes
none, only windows and ALiBi slopes); causal calls of the other alignment with seq_q != seq_kv; a
window or ALiBi aligned top-left with seq_q != seq_kv; non-causal windows whose right side mha_fwd
reads otherwise (above); sinks.
"""

import math

import attnreplay_plugin as ar
from _adapter_common import bottom_right_problem, flash_attn_window, version_tuple

flash_attn = ar.optional_import("flash_attn", kernels=["flash-attn-2"])


def right_window_problem(spec):
    """Why mha_fwd's reading of the window's right side differs from the call's, or None. It makes a
    side >= seq_kv unbounded and then an unbounded right beside a bounded left seq_kv; query i's last
    key, i + seq_kv - seq_q + right, is then another wherever the two rights differ and are not both
    >= seq_q - 1 (past the last key for every row). Causal sets right to 0, as the call's causality
    clips it."""
    if spec.is_causal or (spec.window_left is None and spec.window_right is None):
        return None
    left = -1 if spec.window_left is None or spec.window_left >= spec.seq_kv else spec.window_left
    right = -1 if spec.window_right is None or spec.window_right >= spec.seq_kv else spec.window_right
    if left >= 0 and right < 0:
        right = spec.seq_kv
    taken = math.inf if right < 0 else right
    wanted = math.inf if spec.window_right is None else spec.window_right
    if taken == wanted or min(taken, wanted) >= spec.seq_q - 1:
        return None
    def side(value):
        return "unbounded" if value == math.inf else value

    return (f"a sliding window with right {side(wanted)} and seq_q {spec.seq_q} > seq_kv {spec.seq_kv}: "
            f"FlashAttention-2 takes its right side as {side(taken)}, which shows early query rows other keys")


class FlashAttention2(ar.Kernel):
    name = "flash-attn-2"
    summary = "FlashAttention-2, flash_attn.flash_attn_func (bshd, native GQA)"
    layout = "bshd"
    dtypes = ("float16", "bfloat16")
    native_gqa = True
    causal_alignments = ("bottom_right",)
    extensions = ("window", "softcap", "alibi")

    def __init__(self):
        version = version_tuple(getattr(flash_attn, "__version__", ""))
        # flash-attn 2.1 moved the causal diagonal from the top-left to the bottom-right corner.
        if version and version < (2, 1):
            self.causal_alignments = ("top_left",)

    def supports(self, spec):
        if spec.head_dim_qk > 256:
            return f"head_dim {spec.head_dim_qk} is above 256, FlashAttention-2's largest"
        return right_window_problem(spec) or bottom_right_problem(spec, "FlashAttention-2")

    def run(self, inputs):
        spec = inputs.spec
        alibi = inputs.alibi_slopes
        return flash_attn.flash_attn_func(inputs.q, inputs.k, inputs.v, dropout_p=0.0, softmax_scale=spec.scale,
                                          causal=spec.is_causal, window_size=flash_attn_window(spec, -1),
                                          softcap=spec.softcap,
                                          alibi_slopes=None if alibi is None else alibi.float().contiguous())


if flash_attn is not None:
    # flash_attn is a namespace shared with FlashAttention-4 (flash_attn.cute): it can import with
    # FlashAttention-2 absent.
    if hasattr(flash_attn, "flash_attn_func"):
        ar.register(FlashAttention2())
    else:
        ar.unavailable("flash-attn-2", "flash_attn imports but has no flash_attn_func (FlashAttention-2 is not "
                                       "installed; only another package of the flash_attn namespace is)")
