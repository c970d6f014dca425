"""Time per shape, judge per call, on a capture the size of a real one.

Writes a capture of 200 fp16 calls in 4 shapes (different values in every call), replays it
through 5 GPU kernels once with the default grouping and once timing every call (on the first
`--every-calls` calls only, to stay within the device tool's 10 minutes: the per-call figure is
scaled to 200 calls, and said so), and checks that every call's error statistics are identical in
both runs.

    python bench/timing_groups_check.py --attnreplay build/replay/attnreplay --out groups.json
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from attnreplay_record import read_record, record_command
from pt_calls import SMALL_SHAPES, write_small_shapes

KERNELS = "torch-flash,torch-cudnn,torch-efficient,flash,sage2-int8-fp8"
CALLS = 200


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attnreplay", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--every-calls", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        capture = os.path.join(folder, "calls")
        size = write_small_shapes(capture, CALLS)
        print(f"capture: {CALLS} calls, {size / 1e6:.0f} MB", flush=True)

        def replay(name, *flags):
            report = os.path.join(folder, f"{name}.json")
            command = record_command(args.attnreplay, ["run", capture, "--kernels", KERNELS, "-q", "--no-ceilings",
                                                       *flags], report)
            start = time.perf_counter()
            done = subprocess.run(command, check=False)
            seconds = time.perf_counter() - start
            print(f"{name}: {seconds:.1f} s", flush=True)
            return seconds, read_record(done, report)

        grouped_s, grouped = replay("grouped")
        every_s, every = replay("every", "--time-every-call", "--calls", f"0-{args.every_calls - 1}")

    def errors(report):
        return {(c["call_index"], k["kernel"]): k.get("error") for c in report["calls"] for k in c["kernels"]}

    g, e = errors(grouped), errors(every)
    compared = [key for key in e if key in g]
    identical = all(g[key] == e[key] for key in compared)
    timed_grouped = sum(1 for c in grouped["calls"] for k in c["kernels"]
                        if k.get("timing") and "timing_shared_from" not in k)
    every_scaled_s = every_s * CALLS / args.every_calls
    result = {
        "gpu": grouped["environment"].get("gpu"), "calls": CALLS, "shapes": len(SMALL_SHAPES), "kernels": KERNELS.split(","),
        "capture_bytes": size, "grouped_s": grouped_s, "grouped_timed_measurements": timed_grouped,
        "every_call_s": every_s, "every_call_calls": args.every_calls,
        "every_call_scaled_to_all_s": every_scaled_s, "speedup": every_scaled_s / grouped_s,
        "rows_compared": len(compared), "error_statistics_identical": identical,
        "statuses": sorted({k["status"] for c in grouped["calls"] for k in c["kernels"]}),
    }
    json.dump(result, open(args.out, "w"), indent=2)
    print(json.dumps(result, indent=2))
    sys.exit(0 if identical and result["speedup"] >= 10 else 1)


if __name__ == "__main__":
    main()
