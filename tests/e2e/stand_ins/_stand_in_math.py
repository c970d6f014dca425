"""Test stand-in helper, not a library: the fp64 attention that the stand-ins of
tests/e2e/stand_ins/ compute, each after applying its own library's conventions.

Tensors are (batch, heads, seq, dim) here; a stand-in converts its library's layout first. Rows that
see no key come out as zeros, as flash-attn documents for its kernels."""

import torch


def causal_visible(seq_q: int, seq_kv: int, offset: int) -> torch.Tensor:
    """(seq_q, seq_kv) bool: key j visible to query i when j <= i + offset."""
    rows = torch.arange(seq_q)[:, None]
    cols = torch.arange(seq_kv)[None, :]
    return cols <= rows + offset


def attention_fp64(q, k, v, scale, visible=None, bias=None, log2_bias=None, softcap=0.0, sinks=None):
    """softmax(q·kᵀ·scale + bias) · v in fp64, K and V heads shared by consecutive query heads.

    visible: bool, broadcastable to the scores, False hides the key. bias: added to the scaled
    scores. log2_bias: added to the scores after they are moved into the log2 domain (scores·log2 e),
    as kernels that work in exp2 do with a mask they are given. softcap > 0: the scaled scores
    become softcap·tanh(scores / softcap). sinks: (heads_q) logits that join each row's softmax
    denominator and carry no value."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    heads_q, heads_kv = q.shape[1], k.shape[1]
    if heads_q % heads_kv:
        raise ValueError(f"heads_q {heads_q} is not a multiple of heads_kv {heads_kv}")
    k = k.repeat_interleave(heads_q // heads_kv, dim=1)
    v = v.repeat_interleave(heads_q // heads_kv, dim=1)
    scores = q @ k.transpose(-1, -2) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias.to(torch.float64)
    if log2_bias is not None:
        scores = (scores * 1.4426950408889634 + log2_bias.to(torch.float64)) / 1.4426950408889634
    if visible is not None:
        scores = scores.masked_fill(~visible.to(scores.device), float("-inf"))
    if sinks is not None:  # one more column, always visible, whose value is zero
        sink_column = sinks.to(torch.float64).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, sink_column], dim=-1)
        v = torch.cat([v, v.new_zeros(*v.shape[:-2], 1, v.shape[-1])], dim=-2)
    row_max = scores.amax(dim=-1, keepdim=True)
    seen = torch.isfinite(row_max)
    weights = torch.exp(scores - torch.where(seen, row_max, torch.zeros_like(row_max)))
    total = weights.sum(dim=-1, keepdim=True)
    out = (weights @ v) / torch.where(total > 0, total, torch.ones_like(total))
    return torch.where(seen, out, torch.zeros_like(out))


def window_visible(seq_q: int, seq_kv: int, offset: int, left=None, right=None) -> torch.Tensor:
    """(seq_q, seq_kv) bool: key j visible to query i when i + offset - left <= j <= i + offset + right;
    None leaves a side unbounded."""
    rows = torch.arange(seq_q)[:, None] + offset
    cols = torch.arange(seq_kv)[None, :]
    visible = torch.ones(seq_q, seq_kv, dtype=torch.bool)
    if left is not None:
        visible &= cols >= rows - left
    if right is not None:
        visible &= cols <= rows + right
    return visible


def alibi_bias(slopes: torch.Tensor, seq_q: int, seq_kv: int, offset: int) -> torch.Tensor:
    """-slope · |i + offset - j|, (batch or 1, heads, seq_q, seq_kv), from slopes (heads) or (batch, heads)."""
    distance = (torch.arange(seq_q)[:, None] + offset - torch.arange(seq_kv)[None, :]).abs().to(torch.float64)
    slopes = slopes.to("cpu", torch.float64)
    slopes = slopes[None] if slopes.dim() == 1 else slopes
    return -slopes[:, :, None, None] * distance
