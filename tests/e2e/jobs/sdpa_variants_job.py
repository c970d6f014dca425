"""SDPA calls of several kinds, in this order, each with its own seeded inputs:

0 inference_mode   plain call inside torch.inference_mode()
1 gqa              8 query heads over 2 key/value heads, enable_gqa=True
2 causal           is_causal=True, 7 queries over 9 keys
3 float_mask       an additive float mask (-inf on some keys)
4 dropout          dropout_p=0.25 inside a module in training mode (seeded)

Plain torch. --save writes every output (.npz, one array per case) so that a test can check that
capture changed nothing.
"""

import argparse

import numpy as np
import torch
import torch.nn.functional as F


class DropoutAttention(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.25 if self.training else 0.0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", required=True)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    outs = {}
    q, k, v = r(1, 2, 8, 16), r(1, 2, 8, 16), r(1, 2, 8, 16)
    with torch.inference_mode():
        outs["inference_mode"] = F.scaled_dot_product_attention(q, k, v)
    q, k, v = r(1, 8, 6, 16), r(1, 2, 6, 16), r(1, 2, 6, 16)
    outs["gqa"] = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    q, k, v = r(1, 2, 7, 16), r(1, 2, 9, 16), r(1, 2, 9, 16)
    outs["causal"] = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    q, k, v = r(2, 2, 5, 16), r(2, 2, 6, 16), r(2, 2, 6, 16)
    mask = r(2, 1, 5, 6)
    mask[:, :, :, 4:] = float("-inf")
    outs["float_mask"] = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    q, k, v = r(1, 2, 6, 16), r(1, 2, 6, 16), r(1, 2, 6, 16)
    module = DropoutAttention().train()
    torch.manual_seed(1234)
    outs["dropout"] = module(q, k, v)
    np.savez(args.save, **{name: t.detach().numpy() for name, t in outs.items()})
    print(f"{len(outs)} cases done")


if __name__ == "__main__":
    main()
