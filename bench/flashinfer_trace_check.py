"""FlashInfer-Trace on the GPU: a transformers decoder (GQA, a left-padded batch, generate()) run in
bf16 on CUDA under the preload, its capture converted to FlashInfer-Trace, the folder replayed
through the GPU kernels with --fib-traces, and the traces read back by FlashInfer-Bench's own
models (from `--fib-wheel`, installed without its GPU dependencies; `--wheels` adds the wheels of
what they need that the machine lacks, pydantic's). Prints, per kernel, the
traces' statuses and the median latency and max relative error; the model's own output replayed
from the folder against the capture's figures over the rows that see a key.

    python bench/flashinfer_trace_check.py --attnreplay build/replay/attnreplay \\
        --attncap build/capture/libattncap.so --fib-wheel .whl/flashinfer_bench-0.1.2-py3-none-any.whl \\
        --wheels .whl/pydantic*.whl .whl/annotated_types*.whl .whl/typing_*.whl --out fib.json
"""
import argparse
import collections
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import types

from attnreplay_record import run_for_record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(command, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if result.returncode not in (0, 3):
        sys.exit(f"{' '.join(map(str, command))} failed ({result.returncode}):\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return result.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attnreplay", required=True)
    parser.add_argument("--attncap", required=True)
    parser.add_argument("--fib-wheel", required=True)
    parser.add_argument("--wheels", nargs="*", default=[], help="wheels of its dependencies to install beside it")
    parser.add_argument("--head-dim", type=int, default=128, help="the decoder's head dim (the GPU kernels' sizes)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--kernels", default="gpu")
    parser.add_argument("--baseline", default="torch-flash")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="fib-")
    caps, fi = os.path.join(work, "caps"), os.path.join(work, "fi")
    env = dict(os.environ, LD_PRELOAD=args.attncap, ATTNCAP_OUT=caps, HF_HUB_OFFLINE="1")
    run([sys.executable, os.path.join(ROOT, "tests/e2e/jobs/decoder_job.py"), "--device", "cuda", "--dtype", "bfloat16",
         "--head-dim", str(args.head_dim)], env=env)
    (capture,) = glob.glob(os.path.join(caps, "*.h5"))
    print(run([args.attnreplay, "convert", capture, fi, "--to", "flashinfer-trace"]).strip())
    traces_path = os.path.join(work, "traces.jsonl")
    before, after = os.path.join(work, "before.json"), os.path.join(work, "after.json")
    after_record, done = run_for_record(args.attnreplay, ["run", fi, "--kernels", args.kernels, "--baseline",
                                                          args.baseline, "--fib-traces", traces_path, "-q"],
                                        after, exits=(0, 3))
    print(done.stdout.strip())
    before_record, _ = run_for_record(args.attnreplay, ["run", capture, "--kernels", "reference", "-q"], before,
                                      exits=(0, 3))

    site = os.path.join(work, "site")
    run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, args.fib_wheel, *args.wheels])
    package = types.ModuleType("flashinfer_bench")  # its __init__ imports its GPU dependencies
    package.__path__ = [os.path.join(site, "flashinfer_bench")]
    sys.modules["flashinfer_bench"] = package
    sys.path.insert(0, site)
    from flashinfer_bench.data import Trace, TraceSet
    trace_set = TraceSet.from_path(fi)
    traces = [Trace.model_validate_json(line) for line in open(traces_path)]
    per_kernel = collections.defaultdict(list)
    for trace in traces:
        per_kernel[trace.solution].append(trace)
    results = {"definitions": sorted(trace_set.definitions), "workloads": sum(map(len, trace_set.workloads.values())),
               "traces": len(traces), "kernels": {}}
    print(f"{results['workloads']} workloads of {len(results['definitions'])} definitions; {len(traces)} traces validate")
    for kernel, rows in sorted(per_kernel.items()):
        statuses = collections.Counter(t.evaluation.status.value for t in rows)
        latencies = [t.evaluation.performance.latency_ms for t in rows if t.evaluation.performance]
        errors = [t.evaluation.correctness.max_relative_error for t in rows if t.evaluation.correctness]
        results["kernels"][kernel] = {"statuses": dict(statuses), "median_latency_ms": statistics.median(latencies) if latencies else None,
                                      "worst_max_relative_error": max(errors) if errors else None}
        print(f"  {kernel:<16} {dict(statuses)}  median latency "
              f"{results['kernels'][kernel]['median_latency_ms'] or float('nan'):.4f} ms  worst max_rel "
              f"{results['kernels'][kernel]['worst_max_relative_error'] or float('nan'):.3g}")
    original = {c["call_index"]: c for c in before_record["calls"]}
    worst = 0.0
    for call in after_record["calls"]:
        origin = original[int(call["metadata"]["capture.call_index"])]
        want = {k["kernel"]: k for k in origin["kernels"]}["model-output"]["error"]
        got = {k["kernel"]: k for k in call["kernels"]}["model-output"]["error"]
        worst = max(worst, abs(got["rel_l2"] - want["rel_l2"]) / max(want["rel_l2"], 1e-30))
    results["model_output_rel_l2_largest_relative_difference"] = worst
    print(f"  the model's output from the folder against the capture (rows that see a key): rel_l2 differs by at most {worst:.2e} of itself")
    json.dump(results, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
