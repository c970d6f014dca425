"""Shared helpers of the end-to-end tests: where the binary is, how to run it, how to load .pt.

ctest sets ATTNREPLAY_BIN (the built binary) and ATTNREPLAY_SOURCE_DIR (the repository root).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SOURCE_DIR = Path(os.environ.get("ATTNREPLAY_SOURCE_DIR", Path(__file__).resolve().parents[2]))
# attnreplay_h5 lives with the formats it reads; tests import it from the source tree.
sys.path.insert(0, str(SOURCE_DIR / "formats" / "python"))

# Timing is not what these tests check: two samples, no minimum time, stop as soon as possible.
FAST = ["--min-samples", "2", "--min-time", "0", "--timeout", "1", "--max-noise", "100"]


def binary() -> str:
    path = os.environ.get("ATTNREPLAY_BIN")
    if not path:
        pytest.fail("ATTNREPLAY_BIN is not set (ctest sets it to the built attnreplay)")
    if not os.access(path, os.X_OK):
        pytest.fail(f"ATTNREPLAY_BIN={path} is not an executable")
    return path


def run_attnreplay(*args, cwd=None, timeout=300, check=None, env=None) -> subprocess.CompletedProcess:
    """Runs the binary with `args` (str or Path); `check` asserts the exit status when given."""
    command = [binary(), *map(str, args)]
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    if check is not None:
        assert result.returncode == check, (
            f"exit {result.returncode} (expected {check}) from {' '.join(command)}\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}")
    return result


def load_json(path):
    with open(path) as f:
        return json.load(f)


def with_declared_dtypes(value):
    """Applies docs/format.md's convention: a uint8 tensor whose dict says, under 'dtypes', that it
    is fp8 holds that dtype's bits (Python's torch.load cannot rebuild fp8 from a C++ pickle)."""
    import torch

    if isinstance(value, list):
        return [with_declared_dtypes(v) for v in value]
    if not isinstance(value, dict):
        return value
    declared = value.get("dtypes") or {}
    out = {}
    for key, item in value.items():
        name = declared.get(key) if isinstance(declared, dict) else None
        if isinstance(item, torch.Tensor) and name and item.dtype == torch.uint8 and name != "uint8":
            item = item.view(getattr(torch, name))
        out[key] = with_declared_dtypes(item)
    return out


def load_pt(path):
    """torch.load(weights_only=True) of a .pt written by attnreplay, fp8 tensors restored."""
    import torch

    return with_declared_dtypes(torch.load(path, weights_only=True))


@pytest.fixture(scope="session")
def attnreplay_bin():
    return binary()


def capture_of_killed_writer(path, shape="1,2,300,32"):
    """Writes `path` the way a crash leaves it: the C++ writer appends one generated call, then is
    SIGKILLed while it replays the call, so the file keeps its SWMR-writing flag."""
    import signal
    import time

    import attnreplay_h5

    writer = subprocess.Popen([binary(), "run", "--shape", shape, "--dtype", "fp32", "--kernels", "reference",
                               "--min-samples", "100000", "--min-time", "1000", "--timeout", "1000", "-q",
                               "--save-inputs", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:  # until the call is visible to a (SWMR) reader
            try:
                if len(attnreplay_h5.read_calls(str(path))) == 1:
                    break
            except attnreplay_h5.CaptureFormatError:
                pass
            assert writer.poll() is None, "the writer ended on its own"
            assert time.monotonic() < deadline, "the call never became visible"
            time.sleep(0.1)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
