"""Capture in programs without Python: the C++ libtorch job (tests/programs/sdpa_job.cpp), the
RUNPATH case (a library's bare-name dlopen of its sibling), and processes that never load torch.
"""

import os
import shutil

import numpy as np
import pytest

from capture_common import LIB, PYTHON, RUNPATH_JOB, SDPA_JOB, attncap_lines, job_env, read_calls, run, the_capture


@pytest.fixture(scope="module")
def sdpa_job(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sdpa_job")
    plain = run([SDPA_JOB, folder / "plain.bin"], job_env(preload=False), timeout=120)
    captured = run([SDPA_JOB, folder / "captured.bin"], job_env(folder / "caps"), timeout=120)
    path = the_capture(folder / "caps")
    return dict(folder=folder, plain=plain, captured=captured, calls=read_calls(path))


def test_sdpa_job_outputs_identical_with_preload(sdpa_job):
    plain = (sdpa_job["folder"] / "plain.bin").read_bytes()
    assert len(plain) > 0 and plain == (sdpa_job["folder"] / "captured.bin").read_bytes()
    assert sdpa_job["plain"].stdout == sdpa_job["captured"].stdout == "3 attention calls done\n"


def test_sdpa_job_three_calls_with_shapes_and_dtypes(sdpa_job):
    calls = sdpa_job["calls"]
    assert [c["call_index"] for c in calls] == [0, 1, 2], attncap_lines(sdpa_job["captured"].stderr)
    assert {c["op"] for c in calls} == {"aten::scaled_dot_product_attention"}
    shapes = [tuple(c[n].shape for n in ("q", "k", "v")) for c in calls]
    assert shapes == [((2, 4, 24, 16),) * 3, ((2, 4, 24, 16),) * 3, ((1, 8, 10, 32), (1, 2, 10, 32), (1, 2, 10, 32))]
    assert [c["dtypes"]["q"] for c in calls] == ["float32", "bfloat16", "float32"]
    for c in calls:
        assert c["dtypes"]["k"] == c["dtypes"]["v"] == c["dtypes"]["out"] == c["dtypes"]["q"]


def test_sdpa_job_arguments_of_each_call(sdpa_job):
    c0, c1, c2 = sdpa_job["calls"]
    # Call 0: key-padding bool mask broadcast over heads and queries; batch 1 pads its last 4 keys.
    assert c0["dtypes"]["mask"] == "bool" and c0["mask"].shape == (2, 1, 1, 24)
    assert c0["mask"][0].all() and c0["mask"][1, 0, 0, :20].all() and not c0["mask"][1, 0, 0, 20:].any()
    assert c0["is_causal"] is False and c0["scale"] is None
    # Call 1: causal, bf16, run in c10::InferenceMode.
    assert c1["is_causal"] is True and c1["mask"] is None
    # Call 2: GQA, 8 query heads over 2 kv heads, scale 0.25.
    assert c2["enable_gqa"] is True and c2["scale"] == 0.25 and c2["is_causal"] is False
    assert c0["enable_gqa"] is False and c1["enable_gqa"] is False


def test_sdpa_job_captured_outputs_are_the_programs_outputs(sdpa_job):
    # The job writes each output's contiguous bytes in call order: the captured `out`s, stored
    # bits (bf16 as its 16-bit patterns), concatenated, must be exactly that file.
    calls = read_calls(the_capture(sdpa_job["folder"] / "caps"))
    stored = b"".join(np.ascontiguousarray(c["bits"]["out"]).tobytes() for c in calls)
    assert stored == (sdpa_job["folder"] / "plain.bin").read_bytes()


def test_sdpa_job_call_site_is_the_cpp_frame(sdpa_job):
    # No Python in the process: the call site is the first frame outside torch and libc.
    for c in sdpa_job["calls"]:
        assert c["metadata"].get("call_site", "").startswith("sdpa_job+"), c["metadata"]


def test_runpath_sibling_dlopen_works_under_preload():
    # runpath_job exits 0 iff libruntest_caller.so's dlopen("libruntest_sibling.so") finds the sibling
    # through the caller's RUNPATH; a dlopen wrapper that searches its own paths breaks that.
    plain = run([RUNPATH_JOB], job_env(preload=False), timeout=60, check=False)
    assert plain.returncode == 0, f"the RUNPATH case fails even without the preload: {plain.stderr}"
    result = run([RUNPATH_JOB], job_env(), timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and result.stdout == ""


NON_TORCH = {
    "echo": ["bash", "-c", "echo hi"],
    "ls": ["ls", "/"],
    "python": [PYTHON, "-c", "print(1)"],  # the tests' Python, torch installed but not imported
}


@pytest.mark.parametrize("name", sorted(NON_TORCH))
def test_non_torch_process_runs_unchanged_and_silent(name, tmp_path):
    argv = list(NON_TORCH[name])
    argv[0] = shutil.which(argv[0]) or argv[0]
    plain = run(argv, job_env(preload=False), timeout=60)
    captured = run(argv, job_env(tmp_path / "caps"), timeout=60)
    # libattncap.so must load (a missing file would only make ld.so print a warning).
    assert os.path.exists(LIB)
    assert captured.returncode == plain.returncode == 0
    assert captured.stdout == plain.stdout
    assert captured.stderr == "", captured.stderr  # no '[attncap]' line, no loader warning
    assert not (tmp_path / "caps").exists()  # torch never loaded: no capture started
