"""Times a loop of tiny ops (a + b on one-element CPU tensors), where any per-op cost of an
observer shows undiluted; prints the time per op of each round as JSON. A job for
bench/capture_overhead.py.

--late-op registers an attention op after torch is imported, as flash-attn does on import: capture
can only observe such an op through RecordFunction, which every op then pays for.
"""
import argparse
import json
import time

import torch


def register_late_attention_op():
    @torch.library.custom_op("flash_attn_bench::fwd", mutates_args=())
    def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--late-op", action="store_true")
    args = parser.parse_args()
    if args.late_op:
        register_late_attention_op()
    torch.set_num_threads(1)
    a, b = torch.ones(1), torch.ones(1)
    per_op = []
    with torch.inference_mode():
        for _ in range(1000):
            a + b
        for _ in range(args.rounds):
            start = time.perf_counter()
            for _ in range(args.ops):
                a + b
            per_op.append((time.perf_counter() - start) / args.ops)
    print(json.dumps({"op_s": per_op}))


if __name__ == "__main__":
    main()
