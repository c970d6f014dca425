"""Timing fidelity: attnreplay's median against triton.testing.do_bench's, same GPU, same script.

For torch's flash and cuDNN backends at the Flux shape (1x24x4608x128 bf16), the two medians must
agree within 3 %. Both flush the L2 before each sample.

    python bench/do_bench_check.py --attnreplay build/replay/attnreplay --out do_bench.json
"""
import argparse
import json
import sys
import tempfile

import torch
import triton.testing

from attnreplay_record import run_for_record

SHAPE = (1, 24, 4608, 128)
BACKENDS = {
    "torch-flash": lambda q, k, v: torch.ops.aten._scaled_dot_product_flash_attention(q, k, v),
    "torch-cudnn": lambda q, k, v: torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, False),
}


def flops(b, h, s, d):
    return 4.0 * b * h * s * s * d


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attnreplay", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tolerance", type=float, default=0.03)
    args = parser.parse_args()
    torch.manual_seed(0)
    q, k, v = (torch.randn(*SHAPE, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    results = {"shape": list(SHAPE), "dtype": "bfloat16", "gpu": torch.cuda.get_device_name(), "kernels": {}}
    for name, fn in BACKENDS.items():
        median_ms = triton.testing.do_bench(lambda: fn(q, k, v), warmup=100, rep=1000, return_mode="median")
        results["kernels"][name] = {"do_bench_median_s": median_ms * 1e-3}
    with tempfile.NamedTemporaryFile(suffix=".json") as report:
        replay, _ = run_for_record(args.attnreplay, ["run", "--shape", ",".join(map(str, SHAPE)), "--dtype", "bf16",
                                                     "--kernels", ",".join(BACKENDS), "-q", "--no-ceilings"],
                                   report.name, exits=(0,), capture_output=False)
    for kernel in replay["calls"][0]["kernels"]:
        entry = results["kernels"][kernel["kernel"]]
        entry["attnreplay_median_s"] = kernel["timing"]["median_s"]
        entry["attnreplay_samples"] = kernel["timing"]["samples"]
        entry["attnreplay_discarded"] = kernel["timing"]["discarded_samples"]
        entry["ratio"] = entry["attnreplay_median_s"] / entry["do_bench_median_s"]
        entry["tflops_do_bench"] = flops(*SHAPE) / entry["do_bench_median_s"] / 1e12
        entry["tflops_attnreplay"] = flops(*SHAPE) / entry["attnreplay_median_s"] / 1e12
        entry["within_tolerance"] = abs(entry["ratio"] - 1) <= args.tolerance
    results["passed"] = all(e.get("within_tolerance") for e in results["kernels"].values())
    json.dump(results, open(args.out, "w"), indent=2)
    print(json.dumps(results, indent=2))
    sys.exit(0 if results["passed"] else 1)


if __name__ == "__main__":
    main()
