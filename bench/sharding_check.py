"""Sharded replay on this machine's GPUs under torchrun, against one process.

Writes a capture of 200 fp16 calls in 4 shapes (bench/pt_calls.py's, as timing_groups_check.py), replays it in one
process and under `torchrun --standalone --nproc-per-node N --no-python` (N: the GPUs here, at
least 2), and checks that the joined record holds every call once with error statistics identical
to the one process's. The speed-up is reported; with fewer GPUs than processes, ranks share a GPU
and the figure says nothing about scaling (the result says so).

    python bench/sharding_check.py --attnreplay build/replay/attnreplay --out sharding.json
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
from pt_calls import write_small_shapes

KERNELS = "torch-flash,torch-cudnn,flash"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attnreplay", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--time-every-call", action="store_true",
                        help="time every call (no timing groups): calls long enough for the speed-up to show")
    args = parser.parse_args()
    gpus = torch.cuda.device_count()
    processes = max(2, gpus)
    folder = tempfile.mkdtemp()
    capture = os.path.join(folder, "calls")
    write_small_shapes(capture, args.calls)
    flags = ["run", capture, "--kernels", KERNELS, "--no-ceilings", "-q"]
    if args.time_every_call:
        flags.append("--time-every-call")

    def timed(command, cwd):
        os.makedirs(cwd, exist_ok=True)
        start = time.perf_counter()
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        print(result.stdout + result.stderr, flush=True)
        return seconds, result

    one_folder, sharded_folder = os.path.join(folder, "one"), os.path.join(folder, "sharded")
    one_s, one_run = timed(record_command(args.attnreplay, flags, "one.json", cwd=one_folder), one_folder)
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    sharded_s, sharded_run = timed([torchrun, "--standalone", "--nproc-per-node", str(processes), "--no-python",
                                    *record_command(args.attnreplay, flags, "out.json", cwd=sharded_folder)],
                                   sharded_folder)
    one_rc, sharded_rc = one_run.returncode, sharded_run.returncode
    one = read_record(one_run, "one.json", cwd=one_folder)
    joined = read_record(sharded_run, "out.json", cwd=sharded_folder)

    def errors(record):
        return {(c["call_index"], k["kernel"]): k.get("error") for c in record["calls"] for k in c["kernels"]}

    indices = [c["call_index"] for c in joined["calls"]]
    result = {
        "gpu": one["environment"].get("gpu"), "gpus": gpus, "processes": processes, "calls": args.calls,
        "kernels": KERNELS.split(","), "time_every_call": args.time_every_call, "one_process_s": one_s, "sharded_s": sharded_s, "speedup": one_s / sharded_s,
        "ranks_share_a_gpu": processes > gpus, "every_call_once": indices == list(range(args.calls)),
        "error_statistics_identical": errors(one) == errors(joined), "parts": joined.get("sharded", {}).get("parts"),
        "exit_codes": [one_rc, sharded_rc],
    }
    json.dump(result, open(args.out, "w"), indent=2)
    print(json.dumps(result, indent=2))
    ok = result["every_call_once"] and result["error_statistics_identical"] and sharded_rc == 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
