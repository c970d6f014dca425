"""One training step of a small self-attention layer (forward, backward, SGD step) on the CPU.

Plain torch. --save writes the loss and the updated weights (.npy) so that a test can check that
capture changed nothing.
"""

import argparse

import numpy as np
import torch
import torch.nn.functional as F


class SelfAttention(torch.nn.Module):
    def __init__(self, dim=32, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = SelfAttention().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, target = torch.randn(2, 8, 32), torch.randn(2, 8, 32)
    loss = F.mse_loss(model(x), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    np.save(args.save, np.concatenate([[loss.item()], weights.numpy()]).astype(np.float64))
    print(f"loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
