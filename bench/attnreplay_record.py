"""What a benchmark here does to run attnreplay and read its record: the command with `--json`, the
record read back, and, where the run wrote none, an exit that names the command and shows its output.
"""
import json
import os
import subprocess
import sys


def run_for_record(binary, arguments, json_path, *, env=None, timeout=None):
    """`binary ARGUMENTS --json JSON_PATH` (before a `--` that starts a job's command, as in `e2e`);
    returns (record, completed process). A run that exits non-zero but wrote its record (refused or
    incorrect calls: exit 3) is still a record."""
    arguments = [str(a) for a in arguments]
    at = arguments.index("--") if "--" in arguments else len(arguments)
    command = [str(binary), *arguments[:at], "--json", str(json_path), *arguments[at:]]
    if os.path.exists(json_path):
        os.remove(json_path)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if not os.path.exists(json_path):
        sys.exit(f"no record from {' '.join(command)} (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    with open(json_path) as record:
        return json.load(record), done


def kernel_results(record):
    """(call, kernel result) for every kernel of every call in a run's record."""
    for call in record["calls"]:
        for kernel in call["kernels"]:
            yield call, kernel


def median_seconds(kernel, key="timing"):
    """A kernel result's median, in seconds, or None where it was not timed."""
    timing = kernel.get(key)
    return timing.get("median_s") if timing else None
