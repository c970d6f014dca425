"""An attention op that a library registers after torch is imported, the way flash-attn 2.7+
does: a torch.library custom op named like flash-attn's (flash_attn_mock::fwd), taking
(batch, seq, heads, dim) tensors and computing with SDPA inside.

Three calls: plain, causal, and with an explicit softmax_scale. --save writes every output (.npz)
so that a test can check that capture changed nothing.
"""

import argparse

import numpy as np
import torch
import torch.nn.functional as F


@torch.library.custom_op("flash_attn_mock::fwd", mutates_args=())
def flash_attn_mock_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float,
                        causal: bool) -> torch.Tensor:
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         scale=softmax_scale, is_causal=causal)
    return out.transpose(1, 2).contiguous()


@flash_attn_mock_fwd.register_fake
def _(q, k, v, softmax_scale, causal):
    return torch.empty_like(q)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", required=True)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    outs = {}
    q, k, v = r(2, 9, 3, 16), r(2, 9, 3, 16), r(2, 9, 3, 16)
    outs["plain"] = flash_attn_mock_fwd(q, k, v, 16 ** -0.5, False)
    outs["causal"] = flash_attn_mock_fwd(q, k, v, 16 ** -0.5, True)
    outs["scaled"] = flash_attn_mock_fwd(q, k, v, 0.1, False)
    np.savez(args.save, **{name: t.numpy() for name, t in outs.items()})
    print(f"{len(outs)} calls done")


if __name__ == "__main__":
    main()
