"""flex-attention: torch's `torch.nn.attention.flex_attention.flex_attention`, compiled with
torch.compile (its fused Triton kernel on CUDA; without compilation torch runs an unfused reference).

Written against torch 2.11 (torch/nn/attention/flex_attention.py): flex_attention(query, key, value,
score_mod=None, block_mask=None, scale=None, enable_gqa=False, return_lse=False,
kernel_options=None) on (batch, heads, seq, head_dim) tensors, and BlockMask.from_kv_blocks.
Mapping:
- causal: a mask_mod keeping kv_idx <= q_idx + offset, offset 0 (top-left) or seq_kv - seq_q
  (bottom-right), in a block mask, so that hidden blocks are skipped;
- bool masks: read by the mask_mod (True = may attend), and so part of the block mask; the block
  mask has a batch or head dim only where the mask varies over it;
- float masks: a score_mod adding mask[b, h, q_idx, kv_idx] to the scaled score;
- GQA: enable_gqa=True with K and V as they are; head_dim_vo may differ (only Q and K must agree).

Compiled as torch.compile gives a model that runs many shapes: once per kind of call (device,
dtype, head dims, mask kind, causality and its alignment, GQA), with the sequence lengths dynamic
(batch, heads and head dims static, as a model's are), so that every shape of a kind reuses one
compilation; torch adds one where it specialises a size of 1 (a decode step's one query row, a
sequence of one block) or picks its decoding kernel (fewer than 128 query rows). The block mask is
built from the call's mask with tensor operations (preparation), as create_block_mask would build it
but without compiling a function of its own. A replay compiles each kind ahead on inputs of its own
(precompile(), on attnreplay's thread beside the other kernels' timings), and processes on one
machine (--gpus, launchers) take turns to compile a kind, so that those after the first find
torch's on-disk caches warm. The first run of each call is warm_up(), whose time attnreplay reports apart as
compile_s. `compile=False` (constructor argument or attribute) runs uncompiled: the tests do, on
the CPU.

Declines: dtypes other than fp16, bf16, fp32; on CUDA, head dims below 16 (Triton's tl.dot minimum,
torch/_inductor/kernel/flex/flex_attention.py).
"""

import dataclasses
from typing import Any, Callable, Optional

import torch

import attnreplay_plugin as ar
from _adapter_common import as_4d, causal_offset, compile_lock, leading_dims_vary

flex = ar.optional_import("torch.nn.attention.flex_attention", kernels=["flex-attention"])

# Past dynamo's recompile limit (8 per function by default) torch would quietly run later
# compilations through the unfused eager path: a replay of many kinds of call gets a higher limit.
RECOMPILE_LIMIT = 256
BLOCK = 128  # flex_attention's default sparse block, in queries and keys
# Inputs of its own for compiling ahead: lengths up to this, each in its call's class of size.
AHEAD_LENGTH = 384


@dataclasses.dataclass
class FlexInputs:
    q: Any
    k: Any
    v: Any
    block_mask: Any
    score_mod: Optional[Callable]
    spec: Any
    mask: Any


def ordered_blocks(dense):
    """(count per query block, block indices with those present first), as BlockMask takes them."""
    dense = dense.to(torch.int32)
    return (dense.sum(dim=-1, dtype=torch.int32).contiguous(),
            torch.argsort(dense, dim=-1, descending=True, stable=True).to(torch.int32).contiguous())


def block_mask_of(visible, offset: Optional[int], spec, mask_mod, device):
    """The BlockMask of a call: blocks where every (query, key) is visible are full, those where some
    are partial (the mask_mod decides there), as create_block_mask makes them (the sequences padded
    to whole blocks with hidden keys). `visible` is the call's bool mask (4-D, broadcast dims of 1)
    or None; `offset` the causal diagonal's, None when not causal."""
    sq, skv = spec.seq_q, spec.seq_kv
    rows_b, cols_b = -(-sq // BLOCK), -(-skv // BLOCK)
    if visible is None:
        # Causal alone: from each block's first and last row and key.
        first_row = torch.arange(rows_b, device=device)[:, None] * BLOCK
        last_row = torch.clamp(first_row + BLOCK, max=sq) - 1
        first_col = torch.arange(cols_b, device=device)[None, :] * BLOCK
        last_col = first_col + BLOCK - 1
        whole = (first_row + BLOCK <= sq) & (last_col < skv)
        full = whole & (last_col <= first_row + offset)
        some = first_col <= last_row + offset
        full, partial = full[None, None], (some & ~full)[None, None]
    else:
        if offset is not None:
            rows = torch.arange(sq, device=device)[:, None]
            visible = visible & (torch.arange(skv, device=device)[None, :] <= rows + offset)
        padded = torch.nn.functional.pad(visible, (0, cols_b * BLOCK - skv, 0, rows_b * BLOCK - sq))
        counts = padded.view(padded.shape[0], padded.shape[1], rows_b, BLOCK, cols_b, BLOCK).sum(dim=(3, 5))
        full = counts == BLOCK * BLOCK
        partial = (counts > 0) & ~full
    return flex.BlockMask.from_kv_blocks(*ordered_blocks(partial), *ordered_blocks(full), BLOCK_SIZE=BLOCK,
                                         mask_mod=mask_mod, seq_lengths=(sq, skv))


def size_class(length: int) -> str:
    """The class of a sequence length that torch compiles apart (a size of 1, one block, fewer
    than 128 query rows)."""
    return "1" if length == 1 else "<128" if length < BLOCK else "128" if length == BLOCK else ">128"


class FlexAttention(ar.Kernel):
    name = "flex-attention"
    summary = "torch flex_attention, torch.compile'd with dynamic sequence lengths, with a block mask for causal and bool masks"
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
        self._compiled = {}     # flex_attention compiled per kind of call, on first use
        self._ahead = set()     # the kinds and size classes compiled ahead

    @staticmethod
    def kind(spec) -> tuple:
        return (spec.device, spec.dtype, spec.head_dim_qk, spec.head_dim_vo, spec.mask_kind, spec.is_causal,
                spec.causal_alignment if spec.is_causal else None, spec.is_gqa)

    @staticmethod
    def kind_text(spec) -> str:
        words = [f"{spec.dtype} d{spec.head_dim_qk}/{spec.head_dim_vo}",
                 f"{spec.mask_kind} mask" if spec.mask_kind else "no mask"]
        if spec.is_causal:
            words.append(f"causal {spec.causal_alignment}")
        if spec.is_gqa:
            words.append(f"GQA {spec.heads_q}/{spec.heads_kv}")
        words.append(f"batch {spec.batch}, seq_q {size_class(spec.seq_q)}, seq_kv {size_class(spec.seq_kv)}")
        return ", ".join(words)

    def _flex_attention(self, spec):
        if not self.compile:
            return flex.flex_attention
        kind = self.kind(spec)
        if kind not in self._compiled:
            import torch._dynamo

            config = torch._dynamo.config
            for limit in ("recompile_limit", "cache_size_limit"):
                if hasattr(config, limit):
                    setattr(config, limit, max(getattr(config, limit), RECOMPILE_LIMIT))
            self._compiled[kind] = torch.compile(flex.flex_attention, dynamic=True)
        return self._compiled[kind]

    def supports(self, spec):
        if spec.device == "cuda" and min(spec.head_dim_qk, spec.head_dim_vo) < 16:
            return (f"head dims ({spec.head_dim_qk}, {spec.head_dim_vo}) below 16 are not supported by flex "
                    f"attention's compiled kernel")
        return None

    def prepare(self, inputs):
        spec = inputs.spec
        device = inputs.q.device
        offset = causal_offset(spec) if spec.is_causal else None
        mask = inputs.mask
        score_mod, mask_mod, visible = None, None, None
        # Captured as a tensor, the causal offset is an input of the compiled graph, not a constant
        # it would be specialised to.
        offset_t = torch.tensor(offset if offset is not None else 0, device=device)
        if mask is not None and mask.dtype == torch.bool:
            # The block mask has a batch or head dim only where the mask varies over it.
            varies_over_batch, varies_over_heads = leading_dims_vary(spec)
            # Contiguous, as the inputs compiled ahead are: a captured view's strides would be a
            # compilation of their own.
            visible = as_4d(mask).expand(spec.batch if varies_over_batch else 1,
                                         spec.heads_q if varies_over_heads else 1, spec.seq_q, spec.seq_kv).contiguous()
            every = visible.expand(spec.batch, spec.heads_q, spec.seq_q, spec.seq_kv)
            if spec.is_causal:
                def mask_mod(b, h, q_idx, kv_idx):
                    return every[b, h, q_idx, kv_idx] & (kv_idx <= q_idx + offset_t)
            else:
                def mask_mod(b, h, q_idx, kv_idx):
                    return every[b, h, q_idx, kv_idx]
        elif spec.is_causal:
            def mask_mod(b, h, q_idx, kv_idx):
                return kv_idx <= q_idx + offset_t
        if mask is not None and mask.dtype != torch.bool:
            bias = as_4d(mask).expand(spec.batch, spec.heads_q, spec.seq_q, spec.seq_kv)

            def score_mod(score, b, h, q_idx, kv_idx):
                return score + bias[b, h, q_idx, kv_idx]
        block_mask = block_mask_of(visible, offset, spec, mask_mod, device) if mask_mod is not None else None
        # Batch, heads and head dims are a model's own: static, as users' compilations see them.
        for tensor in (inputs.q, inputs.k, inputs.v):
            for dim in (0, 1, 3):
                torch._dynamo.mark_static(tensor, dim)
        return FlexInputs(inputs.q, inputs.k, inputs.v, block_mask, score_mod, spec, inputs.mask)

    def _compile_run(self, prepared):
        """A first run, where any compilation happens: one process at a time on this machine, and
        without duck-sizing (equal lengths would otherwise be compiled as one symbol, and a call
        with them apart compiled again)."""
        import torch.fx.experimental._config as fx_config

        with compile_lock(repr(self.kind(prepared.spec)) + self.kind_text(prepared.spec)), \
                fx_config.patch(use_duck_shape=False):
            return self.run(prepared)

    def warm_up(self, prepared):
        if not self.compile:
            return False
        self._compile_run(prepared)
        return True

    def precompile(self, spec):
        """Compiles for calls like `spec` on inputs of its own, their lengths cut to AHEAD_LENGTH in
        the same size classes (its run on the GPU is short beside the other kernels' timings)."""
        if not self.compile or spec.device != "cuda":
            return None
        key = (self.kind(spec), spec.batch, spec.heads_q, spec.heads_kv, spec.mask_shape is not None and
               leading_dims_vary(spec), size_class(spec.seq_q), size_class(spec.seq_kv))
        if key in self._ahead:
            return None
        self._ahead.add(key)
        small = dataclasses.replace(spec, seq_q=min(spec.seq_q, AHEAD_LENGTH), seq_kv=min(spec.seq_kv, AHEAD_LENGTH))
        if spec.mask_shape is not None:
            shape = (1,) * (4 - len(spec.mask_shape)) + tuple(spec.mask_shape)
            small = dataclasses.replace(small, mask_shape=shape[:2] + (small.seq_q, small.seq_kv))
        with torch.cuda.stream(torch.cuda.Stream()):
            self._compile_run(self.prepare(self._inputs_like(small)))
        return self.kind_text(spec)

    @staticmethod
    def _inputs_like(spec):
        """Random inputs of `spec`'s shapes and dtype on the GPU, an all-visible (or zero) mask."""
        dtype = getattr(torch, spec.dtype)
        q = torch.randn(spec.batch, spec.heads_q, spec.seq_q, spec.head_dim_qk, device="cuda", dtype=dtype)
        k = torch.randn(spec.batch, spec.heads_kv, spec.seq_kv, spec.head_dim_qk, device="cuda", dtype=dtype)
        v = torch.randn(spec.batch, spec.heads_kv, spec.seq_kv, spec.head_dim_vo, device="cuda", dtype=dtype)
        mask = None
        if spec.mask_kind == "bool":
            mask = torch.ones(spec.mask_shape, dtype=torch.bool, device="cuda")
        elif spec.mask_kind == "float":
            mask = torch.zeros(spec.mask_shape, dtype=dtype, device="cuda")
        return ar.Inputs(q, k, v, mask, spec)

    def run(self, prepared):
        spec = prepared.spec
        return self._flex_attention(spec)(prepared.q, prepared.k, prepared.v, score_mod=prepared.score_mod,
                                          block_mask=prepared.block_mask, scale=spec.scale,
                                          enable_gqa=spec.is_gqa)


if flex is not None:
    ar.register(FlexAttention())
