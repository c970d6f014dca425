"""What a benchmark here does to run attnreplay and read its record: the command with `--json`, the
record read back, and, where the run wrote none, an exit that names the command and shows its output.

A benchmark that times the process itself runs record_command's command between its own clock
readings and then calls read_record, so that reading the record is not in its figure; one that
starts attnreplay under a launcher (torchrun) puts the launcher before that command.
"""
import json
import os
import subprocess
import sys


def record_command(binary, arguments, json_path, *, cwd=None):
    """`binary ARGUMENTS --json JSON_PATH` (before a `--` that starts a job's command, as in `e2e`).
    A record already at JSON_PATH (relative to `cwd`, where the run has one) is removed, so that a run
    that writes none is not read as one that did."""
    arguments = [str(a) for a in arguments]
    at = arguments.index("--") if "--" in arguments else len(arguments)
    path = os.path.join(cwd or "", json_path)
    if os.path.exists(path):
        os.remove(path)
    return [str(binary), *arguments[:at], "--json", str(json_path), *arguments[at:]]


def read_record(done, json_path, *, cwd=None, exits=None, check_record=True):
    """The record a finished run (its subprocess.CompletedProcess) wrote. Where it wrote none, or
    `exits` names the statuses that pass and its own is not among them (`(0,)`: a failed kernel or a
    refcheck's verdict fails the benchmark too), an exit naming the command with what it printed.
    check_record=False gives None for a missing record instead, to a caller that carries on past it."""
    path = os.path.join(cwd or "", json_path)
    missing = not os.path.exists(path)
    if missing and not check_record:
        return None
    if missing or (exits is not None and done.returncode not in exits):
        why = "no record" if missing else f"an exit status not among {list(exits)}"
        sys.exit(f"{why} from {' '.join(map(str, done.args))} (exit {done.returncode}):\n"
                 f"{(done.stdout or '')[-2000:]}\n{(done.stderr or '')[-3000:]}")
    with open(path) as record:
        return json.load(record)


def run_for_record(binary, arguments, json_path, *, cwd=None, exits=None, check_record=True, **run_options):
    """record_command's command, run, and read_record's reading of it: (record, completed process).
    A run that exits non-zero but wrote its record (a failed kernel: exit 1; a refcheck's verdict:
    exit 3) is still a record unless `exits` says otherwise. `run_options` go to subprocess.run
    (env, timeout); the output is captured, for the exit to show, unless they say otherwise
    (capture_output=False: the run prints to the terminal as it goes)."""
    command = record_command(binary, arguments, json_path, cwd=cwd)
    done = subprocess.run(command, cwd=cwd, text=True, **{"capture_output": True, **run_options})
    return read_record(done, json_path, cwd=cwd, exits=exits, check_record=check_record), done


def kernel_results(record):
    """(call, kernel result) for every kernel of every call in a run's record."""
    for call in record["calls"]:
        for kernel in call["kernels"]:
            yield call, kernel


def median_seconds(kernel, key="timing"):
    """A kernel result's median, in seconds, or None where it was not timed."""
    timing = kernel.get(key)
    return timing.get("median_s") if timing else None
