"""Calls SDPA in a loop on fixed inputs and times the loop; prints JSON.

With --torch-save DIR it also does what users do without a capture tool: copy each call's
tensors to the host and torch.save them, inline. bench/capture_overhead.py compares the stall.
"""
import argparse
import json
import os
import time

import torch
import torch.nn.functional as F


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=64)
    parser.add_argument("--shape", default="1,8,1024,64")
    parser.add_argument("--torch-save", help="folder: torch.save each call's q, k, v and output")
    args = parser.parse_args()
    torch.manual_seed(0)
    b, h, s, d = (int(x) for x in args.shape.split(","))
    q, k, v = (torch.randn(b, h, s, d) for _ in range(3))
    F.scaled_dot_product_attention(q, k, v)  # warm-up, never captured-and-timed
    start = time.perf_counter()
    captured_bytes = 0
    for i in range(args.calls):
        out = F.scaled_dot_product_attention(q, k, v)
        if args.torch_save:
            tensors = {"q": q.cpu(), "k": k.cpu(), "v": v.cpu(), "out": out.cpu()}
            torch.save(tensors, os.path.join(args.torch_save, f"call_{i}.pt"))
        captured_bytes += sum(t.nbytes for t in (q, k, v, out))
    elapsed = time.perf_counter() - start
    print(json.dumps({"loop_s": elapsed, "calls": args.calls, "bytes_per_run": captured_bytes}))


if __name__ == "__main__":
    main()
