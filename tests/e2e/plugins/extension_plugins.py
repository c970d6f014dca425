"""Plug-in kernels for calls with a sliding window, softcap, ALiBi and sinks (docs/plugins.md,
`extensions`): one that declares and computes all four from its CallSpec and Inputs, one that declares
none (attnreplay refuses such calls for it, by name), and in bad_extension.py one that names an
extension attnreplay does not know."""
import torch

import attnreplay_plugin as ar


def attention(inputs):
    """The record's semantics (docs/format.md) in the inputs' dtype."""
    s = inputs.spec
    scores = inputs.q @ inputs.k.transpose(-1, -2) * s.scale
    if s.softcap > 0:
        scores = s.softcap * torch.tanh(scores / s.softcap)
    offset = s.seq_kv - s.seq_q if s.causal_alignment == "bottom_right" else 0
    diagonal = torch.arange(s.seq_q)[:, None] + offset
    keys = torch.arange(s.seq_kv)[None, :]
    if inputs.alibi_slopes is not None:
        slopes = inputs.alibi_slopes.to(scores.dtype).view(-1, s.heads_q, 1, 1)
        scores = scores - slopes * (diagonal - keys).abs().to(scores.dtype)
    allowed = torch.ones(s.seq_q, s.seq_kv, dtype=torch.bool)
    if s.is_causal:
        allowed &= keys <= diagonal
    if s.window_left is not None:
        allowed &= keys >= diagonal - s.window_left
    if s.window_right is not None:
        allowed &= keys <= diagonal + s.window_right
    scores = scores.masked_fill(~allowed, float("-inf"))
    if inputs.sinks is not None:
        sink = inputs.sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, sink], dim=-1)
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)[..., :s.seq_kv]
    return weights @ inputs.v


@ar.kernel("py-extensions", device="cpu", dtypes=("float64",), extensions=("window", "softcap", "alibi", "sinks"))
def with_extensions(inputs):
    return attention(inputs)


@ar.kernel("py-no-extensions", device="cpu", dtypes=("float64",))
def without_extensions(inputs):
    return attention(inputs)
