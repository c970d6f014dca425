"""A small self-attention module compiled with torch.compile (inductor, CPU), called a few times.

Plain torch. Compilation traces the module with fake tensors; the compiled code then calls the
attention op on real tensors at run time. --save writes every call's output (.npy).
"""

import argparse

import numpy as np
import torch
import torch.nn.functional as F


class SelfAttention(torch.nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, d))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--eager", action="store_true", help="do not compile (the reference run)")
    args = parser.parse_args()
    torch.manual_seed(0)
    module = SelfAttention().eval()
    inputs = [torch.randn(2, 10, 64) for _ in range(args.runs)]
    run = module if args.eager else torch.compile(module, backend="inductor")
    with torch.no_grad():
        outs = [run(x).numpy() for x in inputs]
    np.save(args.save, np.stack(outs))
    print(f"{args.runs} runs done")


if __name__ == "__main__":
    main()
