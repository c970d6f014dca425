"""Helpers of capture's end-to-end tests: where the built pieces are, how to run a job with and
without LD_PRELOAD=libattncap.so, and how to read what it captured.

ctest sets ATTNREPLAY_ATTNCAP_LIB, ATTNREPLAY_BIN, ATTNREPLAY_SOURCE_DIR, ATTNREPLAY_SDPA_JOB and
ATTNREPLAY_RUNPATH_JOB; when unset they default to the paths of a build in <source>/build, so the
files also run as plain `python -m pytest tests/e2e/test_capture_*.py`.
"""

import glob
import os
import subprocess
import sys
from pathlib import Path

SOURCE_DIR = Path(os.environ.get("ATTNREPLAY_SOURCE_DIR") or Path(__file__).resolve().parents[2])
BUILD_DIR = SOURCE_DIR / "build"
LIB = os.environ.get("ATTNREPLAY_ATTNCAP_LIB") or str(BUILD_DIR / "capture" / "libattncap.so")
BIN = os.environ.get("ATTNREPLAY_BIN") or str(BUILD_DIR / "replay" / "attnreplay")
SDPA_JOB = os.environ.get("ATTNREPLAY_SDPA_JOB") or str(BUILD_DIR / "tests" / "programs" / "sdpa_job")
RUNPATH_JOB = os.environ.get("ATTNREPLAY_RUNPATH_JOB") or str(
    BUILD_DIR / "tests" / "programs" / "runpath_case" / "runpath_job")
# conftest.py's helpers read ATTNREPLAY_BIN at call time.
os.environ.setdefault("ATTNREPLAY_BIN", BIN)
JOBS = Path(__file__).resolve().parent / "jobs"
PYTHON = sys.executable
sys.path.insert(0, str(SOURCE_DIR / "formats" / "python"))

# Timing is not what these tests check: as few samples as the runner allows.
FAST = ["--warmup", "0", "--min-samples", "2", "--min-time", "0", "--timeout", "1", "--max-noise", "100"]


def job_env(out=None, preload=True, **attncap):
    """The job's environment: ours without any LD_PRELOAD or ATTNCAP_* of the caller, plus
    LD_PRELOAD=libattncap.so and ATTNCAP_OUT=out when `preload`, plus `attncap` (name: value)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("ATTNCAP_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    if preload:
        env["LD_PRELOAD"] = LIB
        if out is not None:
            env["ATTNCAP_OUT"] = str(out)
    env.update({k: str(v) for k, v in attncap.items()})
    return env


def run(argv, env, timeout=240, check=True):
    result = subprocess.run([str(a) for a in argv], env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert result.returncode == 0, (f"exit {result.returncode} from {argv}\nstdout:\n{result.stdout}\n"
                                        f"stderr:\n{result.stderr}")
    return result


def run_python_job(script, *args, out=None, preload=True, timeout=240, check=True, **attncap):
    """Runs tests/e2e/jobs/<script> (or any path) with the test's Python."""
    path = script if os.path.isabs(str(script)) else JOBS / script
    return run([PYTHON, path, *args], job_env(out, preload, **attncap), timeout=timeout, check=check)


def capture_and_replay(job, folder, kernels):
    """A stand-in job's end-to-end run: `job` (tests/e2e/jobs/) without capture and with it, each
    saving its outputs (folder/plain.npz, folder/captured.npz), then its one capture replayed
    through `kernels` into folder/r.json. Returns the captured job's result, the capture's calls,
    the report and attnreplay's result."""
    from conftest import FAST as REPLAY_FAST, load_json, run_attnreplay

    run_python_job(job, "--save", folder / "plain.npz", preload=False)
    captured = run_python_job(job, "--save", folder / "captured.npz", out=folder / "caps")
    capture = the_capture(folder / "caps")
    report = folder / "r.json"
    replay = run_attnreplay("run", capture, "--kernels", kernels, "--json", report, *REPLAY_FAST, check=0)
    return captured, read_calls(capture), load_json(report), replay


def attncap_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("[attncap]")]


def capture_files(folder, pattern="attncap-*.h5"):
    return sorted(glob.glob(os.path.join(str(folder), pattern)))


def the_capture(folder):
    """The one capture file a single process wrote into `folder`."""
    files = capture_files(folder)
    found = os.listdir(folder) if os.path.isdir(folder) else "no folder"
    assert len(files) == 1, f"expected one capture file in {folder}, found {found}"
    return files[0]


def read_calls(path, **kwargs):
    import attnreplay_h5

    return attnreplay_h5.read_calls(path, **kwargs)


def attnreplay(*args, timeout=300, check=0):
    result = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if check is not None:
        assert result.returncode == check, (f"exit {result.returncode} (expected {check}) from attnreplay "
                                            f"{' '.join(map(str, args))}\nstdout:\n{result.stdout}\n"
                                            f"stderr:\n{result.stderr}")
    return result


def summary(stderr):
    """The numbers of capture's exit summary ('[attncap] pid N: S attention calls seen, C captured,
    D dropped (queue full), B over budget, F failed; ...'), or None when there is none."""
    import re

    for line in attncap_lines(stderr):
        m = re.search(r"(\d+) attention calls seen, (\d+) captured, (\d+) dropped \(queue full\), (\d+) over budget, "
                      r"(\d+) failed", line)
        if m:
            return dict(zip(("seen", "captured", "dropped_full", "over_budget", "failed"), map(int, m.groups())))
    return None
