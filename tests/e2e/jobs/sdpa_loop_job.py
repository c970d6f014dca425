"""Calls F.scaled_dot_product_attention in a loop, printing 'call <i>' after each (flushed).

Plain torch. --calls 0 loops forever (until killed). Every call gets fresh seeded inputs, unless
--same-inputs (every call repeats the first call's Q, K, V). --save writes every output (.npy).
"""

import argparse
import sys

import numpy as np
import torch
import torch.nn.functional as F


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=10, help="number of calls; 0: forever")
    parser.add_argument("--shape", default="1,2,16,16", help="b,h,s,d of Q, K and V")
    parser.add_argument("--same-inputs", action="store_true")
    parser.add_argument("--save")
    args = parser.parse_args()
    shape = [int(x) for x in args.shape.split(",")]
    g = torch.Generator().manual_seed(0)
    first = None
    outs = []
    i = 0
    while args.calls == 0 or i < args.calls:
        if first is None or not args.same_inputs:
            q, k, v = (torch.randn(*shape, generator=g) for _ in range(3))
            first = q, k, v
        out = F.scaled_dot_product_attention(*first)
        if args.save:
            outs.append(out.numpy())
        print(f"call {i}", flush=True)
        i += 1
    if args.save:
        np.save(args.save, np.stack(outs))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
