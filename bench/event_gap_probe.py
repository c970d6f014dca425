"""Where attnreplay's event timing and triton's do_bench part on calls under 30 us (issue 18).

bench/results/2026-11-24-h100-short-calls/ found attnreplay's `--timing event` 0.7-1.1 us below
do_bench on 15-30 us calls. Here the same torch call is timed by do_bench, then by do_bench's own
loop with one thing changed at a time, toward what attnreplay does (replay/measure/cuda_clock.cu):

- do_bench: triton.testing.do_bench (a 256 MB zero_ before each run);
- loop: do_bench's loop written out (it should agree with do_bench);
- loop-held: the same, with the stream held by torch.cuda._sleep while the host queues the sample,
  as attnreplay's blocking kernel holds it (a host gap between the events disappears);
- loop-100MB: the flush attnreplay uses, twice the L2, still by zero_;
- memset-100MB-held: attnreplay's flush: held, then cudaMemsetAsync of twice the L2;
- memset-100MB-held-sync: and the host waits for each sample, as attnreplay does;
- attnreplay: `attnreplay run --timing event` on the same shape.
Then the kernels one call launches (torch.profiler) and their durations.

    python bench/event_gap_probe.py --attnreplay build/replay/attnreplay --out event_gap.json
"""
import argparse
import ctypes
import glob
import json
import os
import statistics

import torch
import triton
import triton.testing

from short_call_check import BACKENDS, SHAPES, attnreplay_timings, shape_inputs

SAMPLES = 3000


def load_cudart():
    """The CUDA runtime torch uses, for cudaMemsetAsync (torch's Python API has no memset)."""
    candidates = []
    for site in map(os.path.dirname, torch.__path__):
        candidates += glob.glob(os.path.join(site, "nvidia", "**", "libcudart.so*"), recursive=True)
    candidates += ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    for name in candidates:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def event_loop(fn, flush, held, sync=False):
    """Median over SAMPLES of the time between events around fn(), after flush()."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(SAMPLES)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(SAMPLES)]
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    for i in range(SAMPLES):
        if held:
            torch.cuda._sleep(200_000)  # about 100 us at 2 GHz: the host queues the rest meanwhile
        flush()
        starts[i].record()
        fn()
        ends[i].record()
        if sync:
            ends[i].synchronize()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e-3


def kernels_of(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    return [{"kernel": e.key[:90], "count": e.count, "device_us": e.device_time}
            for e in profile.key_averages() if e.device_time > 0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attnreplay", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    cudart = load_cudart()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    big = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    small = torch.empty(2 * l2, dtype=torch.int8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream

    def memset_small():
        status = cudart.cudaMemsetAsync(ctypes.c_void_p(small.data_ptr()), 0, ctypes.c_size_t(small.numel()),
                                        ctypes.c_void_p(stream))
        assert status == 0, f"cudaMemsetAsync: {status}"

    variants = {
        "loop": (big.zero_, False, False),
        "loop-held": (big.zero_, True, False),
        "loop-100MB": (small.zero_, False, False),
    }
    if cudart is not None:
        variants["memset-100MB-held"] = (memset_small, True, False)
        variants["memset-100MB-held-sync"] = (memset_small, True, True)
    rows = []
    for shape in SHAPES:
        q, k, v = shape_inputs(shape)
        ours = attnreplay_timings(args.attnreplay, shape, ["--timing", "event"])
        for name, op in BACKENDS.items():
            fn = lambda: op(q, k, v)  # noqa: E731
            row = {"shape": shape, "kernel": name,
                   "do_bench_us": triton.testing.do_bench(fn, warmup=100, rep=1000, return_mode="median") * 1e3}
            for variant, (flush, held, sync) in variants.items():
                row[f"{variant}_us"] = event_loop(fn, flush, held, sync) * 1e6
            row["attnreplay_us"] = ours[name]["median_s"] * 1e6 if ours.get(name) else None
            row["kernels"] = kernels_of(fn)
            rows.append(row)
            times = "  ".join(f"{key[:-3]} {value:7.2f}" for key, value in row.items()
                              if key.endswith("_us") and value is not None)
            print(f"{'x'.join(map(str, shape)):>18} {name:<16} {times}", flush=True)
            for kernel in row["kernels"]:
                print(f"{'':36}{kernel['device_us']:8.2f} us x{kernel['count']:<3} {kernel['kernel']}")
    json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "samples": SAMPLES, "rows": rows}, open(args.out, "w"), indent=2)


if __name__ == "__main__":
    main()
