"""nn.MultiheadAttention in eval mode with need_weights=False, two ways, in this order:

fast  under torch.no_grad(), batch_first, self-attention: the conditions of its fast path
      (torch._native_multi_head_attention); 10 tokens
slow  the same module with grad enabled, which rules the fast path out: F.multi_head_attention_forward,
      which calls F.scaled_dot_product_attention; 6 tokens

Plain torch. --save writes both outputs (.npz).
"""

import argparse

import numpy as np
import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(embed_dim=32, num_heads=4, batch_first=True).eval()
    outs = {}
    x = torch.randn(2, 10, 32)
    with torch.no_grad():
        outs["fast"], weights = mha(x, x, x, need_weights=False)
    assert weights is None
    x = torch.randn(2, 6, 32)
    outs["slow"], weights = mha(x, x, x, need_weights=False)
    assert weights is None
    np.savez(args.save, **{name: out.detach().numpy() for name, out in outs.items()})
    print("fast and slow path done")


if __name__ == "__main__":
    main()
