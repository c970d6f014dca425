"""Replay throughput end to end: a capture the size of a real one through one fast kernel.

Writes a capture of Flux-sized calls (1x24x4608x128 bf16 Q, K, V and the model's output, about
113 MB a call), converts it to HDF5 with attnreplay (the default capture format), and times:
reading the file with `cat` (the floor), replay through one kernel with the default read-ahead,
the same with read-ahead held to one call (--prefetch-memory 1), and with the reference on 256
sampled rows per head (--ref-sample-rows 256), all with the page cache warm
as the capture was just written. Throughput is the capture's bytes over the wall time of the
whole command. The default 96 calls (10.9 GB) are still a small capture (a CogVideoX run is
about 1,500 calls): enough that the process's start and the one timing of the shape are not most
of the time, as they are not in real use.

    python bench/pipeline_check.py --attnreplay build/replay/attnreplay --out pipeline.json
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

from attnreplay_record import read_record, record_command
from pt_calls import save_call

SHAPE = (1, 24, 4608, 128)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attnreplay", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--calls", type=int, default=96)
    parser.add_argument("--kernel", default="torch-cudnn")
    parser.add_argument("--folder", default=None, help="where the capture goes (default: a temporary folder)")
    args = parser.parse_args()
    folder = args.folder or tempfile.mkdtemp()
    calls = os.path.join(folder, "calls")
    os.makedirs(calls, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    for index in range(args.calls):
        q, k, v = (torch.randn(SHAPE, generator=generator).bfloat16() for _ in range(3))
        out = torch.nn.functional.scaled_dot_product_attention(q[:, :, :64].float(), k.float(), v.float()).bfloat16()
        out = torch.cat([out, torch.zeros(1, 24, SHAPE[2] - 64, 128, dtype=torch.bfloat16)], dim=2)
        save_call(calls, index, q, k, v, op="sdpa", out=out)
    capture = os.path.join(folder, "capture.h5")
    subprocess.run([args.attnreplay, "convert", calls + "/", capture], check=True, stdout=subprocess.DEVNULL)
    shutil.rmtree(calls)  # only the HDF5 capture is read from here on
    size = os.path.getsize(capture)
    print(f"capture: {args.calls} calls, {size / 1e9:.2f} GB", flush=True)

    def timed(command):
        """The process's wall time, and the process."""
        start = time.perf_counter()
        done = subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - start, done

    timed(["cat", capture])  # the page cache holds it from here on, for every reader alike
    cat_s = min(timed(["cat", capture])[0] for _ in range(3))
    print(f"cat: {cat_s:.2f} s, {size / cat_s / 1e9:.2f} GB/s", flush=True)

    def replay(name, *flags):
        report = os.path.join(folder, f"{name}.json")
        seconds, done = timed(record_command(args.attnreplay, ["run", capture, "--kernels", args.kernel,
                                                               "--no-ceilings", "-q", *flags], report))
        record = read_record(done, report)
        kernel_s = sum(k["timing"]["median_s"] for c in record["calls"] for k in c["kernels"]
                       if k.get("timing") and k["kernel"] == args.kernel)
        stages = {}
        for call in record["calls"]:
            for stage, spent in call.get("replay_seconds", {}).items():
                stages[stage] = stages.get(stage, 0.0) + spent
        print(f"{name}: {seconds:.2f} s, {size / seconds / 1e9:.2f} GB/s ({len(record['calls'])} calls); stages (s): "
              + ", ".join(f"{stage} {spent:.2f}" for stage, spent in sorted(stages.items())), flush=True)
        record["stage_seconds"] = stages
        return seconds, record

    pipelined_s, pipelined = replay("read-ahead")
    serial_s, _ = replay("one-call", "--prefetch-memory", "1")
    sampled_s, sampled = replay("sampled-rows", "--ref-sample-rows", "256")
    statuses = sorted({k["status"] for c in pipelined["calls"] for k in c["kernels"]})
    result = {
        "gpu": pipelined["environment"].get("gpu"), "calls": args.calls, "shape": SHAPE, "kernel": args.kernel,
        "capture_bytes": size, "cat_s": cat_s, "cat_gbps": size / cat_s / 1e9,
        "replay_s": pipelined_s, "replay_gbps": size / pipelined_s / 1e9,
        "replay_one_call_ahead_s": serial_s, "replay_one_call_ahead_gbps": size / serial_s / 1e9,
        "replay_over_cat": pipelined_s / cat_s, "statuses": statuses,
        "stage_seconds": pipelined["stage_seconds"],
        "replay_sampled_rows_s": sampled_s, "replay_sampled_rows_gbps": size / sampled_s / 1e9,
        "sampled_rows_stage_seconds": sampled["stage_seconds"],
        "goal": "at least 2 GB/s, or within 1.2x of cat where that is lower",
    }
    result["goal_met"] = result["replay_gbps"] >= min(2.0, result["cat_gbps"] / 1.2)
    json.dump(result, open(args.out, "w"), indent=2)
    print(json.dumps(result, indent=2))
    sys.exit(0 if result["goal_met"] and "failed" not in statuses else 1)


if __name__ == "__main__":
    main()
