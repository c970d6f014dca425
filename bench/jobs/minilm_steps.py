"""Times each step (one encode of a batch) of the real MiniLM model; prints the times as JSON.

A job for bench/capture_overhead.py: it knows nothing of capture, which is what is measured. The
model and sentences are examples/run_minilm.py's.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from run_minilm import SENTENCES, load_model  # noqa: E402  (sets the offline switches first)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)  # one thread: steadier per-step times on a shared machine
    model = load_model()
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
