"""Calls SDPA, forks; the child calls SDPA twice and exits; the parent waits, then calls SDPA
twice more. Plain torch (os.fork). Prints each call's owner; exits 1 if the child failed.
--save writes the parent's outputs (.npy).
"""

import argparse
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F


def attention(g, seq):
    q, k, v = (torch.randn(1, 2, seq, 16, generator=g) for _ in range(3))
    return F.scaled_dot_product_attention(q, k, v)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--save")
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    outs = [attention(g, 8)]  # parent, before the fork: seq 8
    print("parent call 0", flush=True)
    pid = os.fork()
    if pid == 0:
        # GNU OpenMP's thread pool does not survive fork(): one thread in the child, as torch's
        # DataLoader workers do (without this the child hangs, capture or not).
        torch.set_num_threads(1)
        # The child's calls use seq 5, so the parent's file can be checked for them.
        for i in range(2):
            attention(g, 5)
            print(f"child call {i}", flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    for i in range(1, 3):
        outs.append(attention(g, 8))
        print(f"parent call {i}", flush=True)
    if args.save:
        np.save(args.save, np.stack([o.numpy() for o in outs]))
    sys.exit(0 if os.waitstatus_to_exitcode(status) == 0 else 1)


if __name__ == "__main__":
    main()
