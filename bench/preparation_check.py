#!/usr/bin/env python3
"""The quantized kernels' input preparation against its memory-bandwidth bound, variant by variant.

Runs `attnreplay run` on the shapes of bench/suite_quant.txt for sage1-int8, sage2-int8-fp8 and
fa3-fp8, once per variant, and tabulates each kind's preparation time, its bound and their ratio,
the attention alone and the whole call, with the preparation's standard error and the clocks of
the three timings. Beside them, a plain copy of the bytes a one-read preparation moves: what a
launch of that size reaches, where the bound takes the rate of a 1 GiB copy. A variant is a set of
environment variables: to compare a change with what it replaces side by side, put both behind a
variable for the measurement (as the preparation-fusion measurement did: bench/results/experiments.md).
Used by bench/gpu.sh's `prep` step.
"""
import argparse
import functools
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from attnreplay_record import run_for_record

ROOT = Path(__file__).resolve().parent.parent
KINDS = ["sage1-int8", "sage2-int8-fp8", "fa3-fp8"]
# name -> environment. Add the variables a change under measurement reads.
VARIANTS = {
    "default": {},
}


def suite_cases(path):
    cases = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        args = shlex.split(line)
        shape = args[args.index("--shape") + 1]
        tag = args[args.index("--case_tag") + 1]
        cases.append((tag, ["--shape", shape, "--dtype", "bf16"] + (["--causal"] if "--causal" in args else [])))
    return cases


CLUSTER_KEYS = ("gpu_clusters_of_8_at_once", "gpu_clusters_of_16_at_once")

# The inputs each kind prepares (sage2-int8-fp8 codes Q inside its attention kernel).
PREPARED_INPUTS = {"sage1-int8": 2, "sage2-int8-fp8": 2, "fa3-fp8": 3}


@functools.lru_cache(maxsize=None)
def copy_floor_s(elements):
    """A device-to-device copy (torch's copy_, as the copy ceiling is measured) of the bytes a
    one-read preparation of `elements` bf16 values moves: 2 read and 1 written an element, so 1.5
    each way. Cold L2, the median of CUDA event timings. What a launch of that size reaches, where
    the bound takes the ceiling of a 1 GiB copy."""
    import torch
    src = torch.empty(elements * 3 // 2, device="cuda", dtype=torch.uint8).random_(0, 255)
    dst = torch.empty_like(src)
    flush = torch.empty(256 << 20, device="cuda", dtype=torch.int8)  # over L2's 50 MB
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(110):
        flush.zero_()
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        if i >= 10:
            times.append(start.elapsed_time(end) / 1e3)
    del src, dst, flush
    torch.cuda.empty_cache()  # the attnreplay runs after it need the memory
    return sorted(times)[len(times) // 2]


def shape_elements(case_args):
    b, h, s, d = (int(x) for x in case_args[case_args.index("--shape") + 1].split(","))
    return b * h * s * d


def mhz(value):
    return f"{value:4.0f}" if value is not None else "   -"


def median_stderr(timing):
    # An untimed preparation (every sample discarded on a throttled GPU) has a null median.
    if timing.get("median_s") is None:
        return None
    return 1.2533 * timing["spread_rel"] * timing["median_s"] / max(1, timing["samples"]) ** 0.5


def run_case(binary, case_args, kinds, env_extra, timeout):
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        env = dict(os.environ, **env_extra)
        report, done = run_for_record(binary, ["run", *case_args, "--kernels", ",".join(kinds), "--ref-sample-rows",
                                               "64"], out, check_record=False, env=env, timeout=timeout)
        if done.returncode != 0 or report is None:
            raise RuntimeError(f"{shlex.join(done.args)}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        call = report["calls"][0]
    # How the GPU's SMs are grouped (docs/cli.md): the cluster kernels' speed may differ with it.
    layout = {key: report["environment"].get(key) for key in CLUSTER_KEYS}
    rows = {}
    for k in call["kernels"]:
        prep = k.get("preparation") or {}
        # A kind the GPU declined (its status says why) has no timings.
        alone, whole = k.get("timing") or {}, k.get("timing_with_preparation") or {}
        preparation = k.get("timing_of_preparation")
        rows[k["kernel"]] = {
            # The preparation alone: its median's standard error (1.2533 sigma / sqrt(n), sigma
            # from the robust spread), and the clocks of the three timings: the kernel and the
            # whole call in turns, the preparation alone after them.
            "preparation_stderr_s": median_stderr(preparation) if preparation else None,
            "preparation_mhz": (preparation or {}).get("sm_clock_median_mhz"),
            "kernel_mhz": alone.get("sm_clock_median_mhz"),
            "whole_mhz": whole.get("sm_clock_median_mhz"),
            "status": k["status"],
            "kernel_s": alone.get("median_s"),
            "whole_s": (k.get("timing_with_preparation") or {}).get("median_s"),
            "preparation_s": prep.get("time_s"),
            "bound_s": prep.get("bound_s"),
            "ratio_to_bound": prep.get("ratio_to_bound"),
            "bytes": prep.get("bytes"),
            **layout,
        }
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attnreplay", required=True)
    parser.add_argument("--suite", default=str(ROOT / "bench" / "suite_quant.txt"))
    parser.add_argument("--variants", default="default", help="comma-separated: " + ",".join(VARIANTS))
    parser.add_argument("--cases", default="", help="comma-separated case tags (default: all)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds (default: all three)")
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    variants = args.variants.split(",")
    kinds = args.kinds.split(",")
    wanted = set(filter(None, args.cases.split(",")))
    results = []
    failed = False
    print(f"{'case':28} {'variant':10} {'kind':15} {'prep ms':>9} {'bound ms':>9} {'ratio':>6} {'kernel ms':>10} {'whole ms':>9} {'whole-kernel':>12} {'±2se ms':>8} {'MHz kernel/whole/prep':>21} {'copy ms':>8} {'/copy':>6}")
    for tag, case_args in suite_cases(args.suite):
        if wanted and tag not in wanted:
            continue
        for variant in variants:
            try:
                rows = run_case(args.attnreplay, case_args, kinds, VARIANTS[variant], args.timeout)
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                print(f"{tag:28} {variant:10} FAILED: {error}", flush=True)
                failed = True
                continue
            for kind in kinds:
                r = rows[kind]
                r["copy_s"] = copy_floor_s(PREPARED_INPUTS[kind] * shape_elements(case_args))
                results.append({"case": tag, "variant": variant, "kind": kind, **r})
                if None in (r["preparation_s"], r["kernel_s"], r["whole_s"]):
                    # Declined, or untimed (every sample discarded: a throttled GPU; the JSON's notes say).
                    print(f"{tag:28} {variant:10} {kind:15} {r['status']}, timings kernel/whole/prep: "
                          f"{r['kernel_s']}/{r['whole_s']}/{r['preparation_s']}", flush=True)
                    continue
                whole = r["whole_s"]
                print(f"{tag:28} {variant:10} {kind:15} {r['preparation_s'] * 1e3:9.4f} {r['bound_s'] * 1e3:9.4f} "
                      f"{r['ratio_to_bound']:6.2f} {r['kernel_s'] * 1e3:10.4f} {whole * 1e3:9.4f} "
                      f"{(whole - r['kernel_s']) * 1e3:12.4f} {2 * r['preparation_stderr_s'] * 1e3:8.4f} "
                      f"{mhz(r['kernel_mhz'])}/{mhz(r['whole_mhz'])}/{mhz(r['preparation_mhz'])} "
                      f"{r['copy_s'] * 1e3:8.4f} {r['preparation_s'] / r['copy_s']:6.2f}", flush=True)
    if results:
        print("GPU clusters of 8 / 16 CTAs at once, one an SM: "
              + " / ".join(str(results[0].get(key)) for key in CLUSTER_KEYS))
    Path(args.out).write_text(json.dumps({"kinds": kinds, "variants": {v: VARIANTS[v] for v in variants},
                                          "results": results}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
