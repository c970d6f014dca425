"""flash-attn 2.7's forward op as the dispatcher sees it, on the CPU: a torch.library custom op
registered under flash-attn's own name and schema (flash_attn::_flash_attn_forward: q, k, v in
(batch, seq, heads, dim), dropout_p, softmax_scale, causal, window_size_left, window_size_right,
softcap, alibi_slopes, return_softmax), computing what flash-attn computes with plain torch ops.

Five calls: plain, a sliding window, a softcap, ALiBi slopes, and all three. --save writes every
output."""
import argparse
import math
from typing import Optional

import numpy as np
import torch

from flash_attn_math import scores_and_visibility


@torch.library.custom_op("flash_attn::_flash_attn_forward", mutates_args=(), device_types="cpu")
def _flash_attn_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, softmax_scale: float,
                        causal: bool, window_size_left: int, window_size_right: int, softcap: float,
                        alibi_slopes: Optional[torch.Tensor], return_softmax: bool
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    qh, kh, vh = (t.transpose(1, 2).float() for t in (q, k, v))  # (b, h, s, d)
    scores, allowed = scores_and_visibility(qh, kh, softmax_scale, causal, window_size_left, window_size_right,
                                            softcap, alibi_slopes)
    probabilities = torch.softmax(scores.masked_fill(~allowed, -math.inf), dim=-1)
    out = (probabilities @ vh).transpose(1, 2).to(q.dtype).contiguous()
    lse = torch.logsumexp(scores, dim=-1)
    return out, lse, torch.empty(0), torch.empty(2, dtype=torch.int64)


@_flash_attn_forward.register_fake
def _(q, k, v, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap, alibi_slopes,
      return_softmax):
    b, s, h, _ = q.shape
    return torch.empty_like(q), q.new_empty(b, h, s), q.new_empty(0), q.new_empty(2, dtype=torch.int64)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", required=True)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 16, 3, 16, generator=g) for _ in range(3))
    scale = 16 ** -0.5
    forward = torch.ops.flash_attn._flash_attn_forward
    outs = {
        "plain": forward(q, k, v, 0.0, scale, True, -1, -1, 0.0, None, False)[0],
        "window": forward(q, k, v, 0.0, scale, True, 4, 0, 0.0, None, False)[0],
        "softcap": forward(q, k, v, 0.0, scale, False, -1, -1, 30.0, None, False)[0],
        "alibi": forward(q, k, v, 0.0, scale, True, -1, -1, 0.0, torch.tensor([0.5, 0.25, 0.125]), False)[0],
        "all": forward(q, k, v, 0.0, scale, False, 6, 2, 20.0, torch.tensor([0.5, 0.25, 0.125]), False)[0],
    }
    np.savez(args.save, **{name: t.numpy() for name, t in outs.items()})


if __name__ == "__main__":
    main()
