"""flash-attn-4 and flash-attn-4-varlen: FlashAttention-4's `flash_attn.cute.interface` (PyPI
`flash-attn-4`, CuTe DSL kernels compiled at first use): `flash_attn_func` for dense calls,
`flash_attn_varlen_func` for ragged and paged batches.

Written against flash-attention's flash_attn/cute/interface.py of 2026 (flash-attn-4 4.0 betas):
flash_attn_func(q, k, v, qv=None, ..., softmax_scale=None, causal=False, window_size=(None, None),
learnable_sink=None, softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False, score_mod=None,
..., mask_mod=None, ..., return_lse=False) returns (out, lse) (lse None unless asked for), as every
version since the first has; a bare output is accepted too. It takes (batch, seq, heads, head_dim)
fp16 or bf16 tensors, K and V with fewer heads for GQA, and aligns the causal diagonal to the
bottom right (flash_attn/cute/mask.py). Head dims (interface.py's _validate_head_dims, 16-bit
inputs): multiples of 8; on Hopper (sm90) both in [8, 256]; on Blackwell (sm100/sm110) both in
[8, 128], or (192, 128), (256, 256), or head_dim_vo 512 with head_dim_qk 64 or 512.

flash_attn_varlen_func(q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
max_seqlen_k=None, min_seqlen_k=None, seqused_q=None, seqused_k=None, gather_kv_indices=None,
page_table=None, softmax_scale=None, causal=False, ...) returns (out, lse) too, with the same head dim
rules. q is (total_q, heads, head_dim) with cu_seqlens_q (batch + 1); k and v are packed,
(total_k, heads_kv, head_dim), with cu_seqlens_k, or pages, (pages, page_size, heads_kv, head_dim),
with page_table (batch, pages per sequence) and no cu_seqlens_k; seqused_k (batch) gives each
sequence's keys where they are fewer than its segment, and with pages always. These are attnreplay's
thd tensors as they are; every index tensor is int32 and contiguous, as it requires. Causality is
bottom-right within each sequence (its own seqlen_k - seqlen_q). max_seqlen_q and max_seqlen_k are
the longest sequence's queries and keys, as vLLM passes them (they size its grid and split; left out,
it takes total_q and every key row held). seqused_k is passed only where it limits a packed sequence,
or with pages: the sm100 kernel for (256, 256) takes no seqused_k.

Windows, softcaps and sinks, both functions: window_size (left, right), None unbounded, keeps key j for
query i when i + seq_kv - seq_q - left <= j <= i + seq_kv - seq_q + right (flash_attn/cute/mask.py,
within each sequence for varlen), bottom-right whatever the causal flag; causal sets right to 0
(_resolve_causal_local_window), the record's intersection of both. softcap s turns each scaled
score x into s * tanh(x / s). learnable_sink, (heads_q) fp16/bf16/fp32, is one logit per head added
to each row's softmax denominator, unscaled (softmax.py's finalize), and a row with no key gives 0.
The sm80 kernel (sm8x, sm12x) takes no learnable_sink, and the sm100 kernel for head dims (256, 256)
neither a softcap nor a learnable_sink (interface.py's asserts). No ALiBi.

Masks are CuTe DSL callables there (score_mod / mask_mod), not tensors, so none is taken.
Declines: other dtypes; head dims outside the rules above for the GPU's architecture; masks;
top-left causal calls with seq_q != seq_kv (for flash-attn-4-varlen, in any sequence); a window aligned
top-left with seq_q != seq_kv (in any sequence); ALiBi; sinks on sm8x and sm12x; softcaps and sinks on
sm100/sm110 with head dims (256, 256);
flash-attn-4-varlen: dense calls; paged batches on sm8x and sm12x (FlashAttention-4 has no paged
kernel there); on sm100/sm110 with head dims (256, 256), paged batches and packed ones whose
seqused_k leaves keys unused.
"""

import attnreplay_plugin as ar
from _adapter_common import bottom_right_problem, flash_attn_window, gpu_capability, output_only

interface = ar.optional_import("flash_attn.cute.interface", kernels=["flash-attn-4", "flash-attn-4-varlen"])


class FlashAttention4(ar.Kernel):
    name = "flash-attn-4"
    summary = "FlashAttention-4, flash_attn.cute.interface.flash_attn_func (bshd, native GQA)"
    layout = "bshd"
    dtypes = ("float16", "bfloat16")
    native_gqa = True
    different_vo = True
    causal_alignments = ("bottom_right",)
    extensions = ("window", "softcap", "sinks")
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
        if spec.sinks_shape is not None and major in (8, 12):
            return f"sinks: FlashAttention-4's kernel for sm{major}x takes no learnable_sink"
        if major in (10, 11) and (d, dv) == (256, 256) and (spec.softcap > 0 or spec.sinks_shape is not None):
            what = " and ".join(name for name, present in (("a softcap", spec.softcap > 0),
                                                           ("sinks", spec.sinks_shape is not None)) if present)
            return f"{what}: FlashAttention-4's sm{major}0 kernel for head dims (256, 256) takes neither"
        return bottom_right_problem(spec, "FlashAttention-4")

    def run(self, inputs):
        spec = inputs.spec
        return output_only(interface.flash_attn_func(inputs.q, inputs.k, inputs.v, softmax_scale=spec.scale,
                                                     causal=spec.is_causal, **extension_arguments(inputs)))


def extension_arguments(inputs) -> dict:
    """window_size, softcap and learnable_sink as both of FlashAttention-4's functions take them."""
    sinks = inputs.sinks
    # fp32 holds any sink the record's fp16 or bf16 holds exactly, and is the dtype it computes in.
    return dict(window_size=flash_attn_window(inputs.spec, None), softcap=inputs.spec.softcap,
                learnable_sink=None if sinks is None else sinks.float().contiguous())


def seqused_limits_keys(spec) -> bool:
    """Whether a packed call's seqused_k leaves some sequence's segment of keys partly unused (its
    segments hold seq_kv rows in all; the sequences use k_lens)."""
    return spec.page_size == 0 and sum(spec.k_lens) != spec.seq_kv


class FlashAttention4Varlen(FlashAttention4):
    name = "flash-attn-4-varlen"
    summary = ("FlashAttention-4, flash_attn.cute.interface.flash_attn_varlen_func (thd: packed keys or a paged "
               "KV cache, native GQA)")
    layout = "thd"
    paged = True

    def supports(self, spec):
        reason = super().supports(spec)
        if reason:
            return reason
        major = self._major()
        if spec.page_size and major in (8, 12):
            return f"FlashAttention-4 has no paged KV kernel on sm{major}x"
        if major in (10, 11) and (spec.head_dim_qk, spec.head_dim_vo) == (256, 256) and (
                spec.page_size or seqused_limits_keys(spec)):
            return (f"FlashAttention-4's sm{major}0 kernel for head dims (256, 256) takes no seqused_k, which a "
                    f"{'paged batch' if spec.page_size else 'packed batch using part of its keys'} needs")
        return None

    def run(self, inputs):
        spec = inputs.spec
        paged = inputs.block_table is not None
        return output_only(interface.flash_attn_varlen_func(
            inputs.q, inputs.k, inputs.v, cu_seqlens_q=inputs.cu_seqlens_q,
            cu_seqlens_k=None if paged else inputs.cu_seqlens_k,
            max_seqlen_q=max(spec.q_lens), max_seqlen_k=max(spec.k_lens),
            seqused_k=inputs.seqused_k if paged or seqused_limits_keys(spec) else None,
            page_table=inputs.block_table, softmax_scale=spec.scale, causal=spec.is_causal,
            **extension_arguments(inputs)))


if interface is not None:
    ar.register(FlashAttention4())
    ar.register(FlashAttention4Varlen())
