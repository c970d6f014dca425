"""Capture in the user's own environment, whatever its torch (docs/capture.md). A second venv with
an older torch and another Python (scripts/setup.sh builds it) runs two jobs under the preload:
the MiniLM sentence encoder and a transformers decoder (GQA, left padding, generate()).

Without a capture part built for that torch, each job runs exactly as without the preload and one
line says so, naming the command that builds the part. After that command, the jobs are captured,
their outputs still bit-identical, and the captures replay with attnreplay's own pinned torch."""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from capture_common import BUILD_DIR, LIB, SOURCE_DIR, attncap_lines, capture_files, read_calls
from conftest import FAST, load_json, run_attnreplay

OTHER_PYTHON = Path(os.environ.get("ATTNREPLAY_OTHER_PYTHON") or Path(
    os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "attnreplay" / "venv-other-torch" / "bin" / "python")
JOBS = {
    "minilm": [str(SOURCE_DIR / "examples" / "run_minilm.py")],
    "decoder": [str(Path(__file__).resolve().parent / "jobs" / "decoder_job.py")],
}


def other_torch():
    if not OTHER_PYTHON.exists():
        pytest.fail(f"{OTHER_PYTHON} is missing: `bash scripts/setup.sh tests` makes the second venv")
    probe = subprocess.run([str(OTHER_PYTHON), "-c", "import os, sys, torch; print(torch.__version__); "
                            "print(os.path.dirname(torch.__file__)); print(sys.version.split()[0])"],
                           capture_output=True, text=True, check=True)
    version, folder, python = probe.stdout.split()
    return version, folder, python


def run_job(job, tmp_path, name, preload, parts=None):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("ATTNCAP_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    # Only the parts folder given here: the user's own cache must not decide the test.
    env["ATTNCAP_PARTS_DIR"] = str(parts or tmp_path / "no-parts")
    out = tmp_path / f"{name}-caps"
    if preload:
        env.update(LD_PRELOAD=LIB, ATTNCAP_OUT=str(out))
    saved = tmp_path / f"{name}.{'npz' if job == 'decoder' else 'npy'}"
    result = subprocess.run([str(OTHER_PYTHON), *JOBS[job], "--save", str(saved)], env=env, capture_output=True,
                            text=True, timeout=600)
    return result, saved, out


def same_outputs(a, b):
    if str(a).endswith(".npz"):
        x, y = np.load(a), np.load(b)
        return all(np.array_equal(x[k], y[k]) for k in x.files) and x.files == y.files
    return np.array_equal(np.load(a), np.load(b))


def test_the_second_venv_has_another_torch_and_python():
    version, _, python = other_torch()
    import torch
    assert version.split("+")[0] != torch.__version__.split("+")[0], (version, torch.__version__)
    assert python.split(".")[:2] != list(map(str, sys.version_info[:2])), python


@pytest.mark.parametrize("job", list(JOBS))
def test_without_a_part_for_its_torch_the_job_is_unchanged_and_told_how(job, tmp_path):
    version, folder, _ = other_torch()
    plain, plain_out, _ = run_job(job, tmp_path, "plain", preload=False)
    preloaded, preloaded_out, caps = run_job(job, tmp_path, "preloaded", preload=True)
    assert plain.returncode == 0, plain.stderr
    assert preloaded.returncode == plain.returncode
    assert preloaded.stdout == plain.stdout
    assert same_outputs(plain_out, preloaded_out)
    lines = attncap_lines(preloaded.stderr)
    assert len(lines) == 1, preloaded.stderr
    assert f"no capture part is built for this job's torch {version} (C++11 ABI 1, {folder})" in lines[0]
    assert f"attnreplay-capture-build --torch {folder}" in lines[0]
    assert not capture_files(caps)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """`cmake --install` of this build, then moved to another folder: the tree a user copies around."""
    root = tmp_path_factory.mktemp("install")
    build_dir = Path(os.environ.get("ATTNREPLAY_BUILD_DIR", BUILD_DIR))
    subprocess.run(["cmake", "--install", str(build_dir), "--prefix", str(root / "installed")], check=True,
                   capture_output=True)
    moved = root / "moved"
    shutil.move(str(root / "installed"), str(moved))
    return moved


def test_the_installed_tree_copied_elsewhere_captures_and_replays_the_demo(installed, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("ATTNCAP_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", LD_PRELOAD=str(installed / "lib" / "libattncap.so"),
               ATTNCAP_OUT=str(tmp_path / "caps"), ATTNCAP_PARTS_DIR=str(tmp_path / "no-parts"))
    job = subprocess.run([sys.executable, str(SOURCE_DIR / "examples" / "run_minilm.py")], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert job.returncode == 0, job.stderr
    files = capture_files(tmp_path / "caps")
    assert len(files) == 1, job.stderr
    report = tmp_path / "r.json"
    replay = subprocess.run([str(installed / "bin" / "attnreplay"), "run", files[0], "--kernels", "all", "--json",
                             str(report), "-q", *FAST], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    record = load_json(report)
    assert len(record["calls"]) == 6
    assert {k["status"] for c in record["calls"] for k in c["kernels"]} <= {"not_verified", "not_supported"}


@pytest.fixture(scope="module")
def parts(installed, tmp_path_factory):
    """The part built for the second venv's torch by the installed tree's build command (from the
    sources installed with it), timed, with its peak memory."""
    folder = tmp_path_factory.mktemp("parts")
    # Run from a fresh Python, whose children are the build command's alone: their peak memory.
    measure = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(r.returncode)")
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", measure, str(installed / "bin" / "attnreplay-capture-build"),
                             "--python", str(OTHER_PYTHON),
                             "--out", str(folder), "--jobs", "2"], capture_output=True, text=True, timeout=1200)
    seconds = time.perf_counter() - start
    assert result.returncode == 0, result.stdout + result.stderr
    peak_mib = int(result.stderr.strip().splitlines()[-1]) / 1024
    print(f"\nattnreplay-capture-build: {seconds:.0f} s, peak memory of one compiler or linker {peak_mib:.0f} MiB")
    (Path(str(folder)) / "build-cost.txt").write_text(f"{seconds:.1f} s, {peak_mib:.0f} MiB\n")
    return folder, result.stdout + result.stderr


def test_the_build_command_names_the_torch_it_built_for(parts, installed):
    folder, stdout = parts
    # The installed sources, not this checkout's.
    assert f"configuring {installed}/bin/../share/attnreplay/capture-source against" in stdout
    version, _, _ = other_torch()
    built = Path(str(folder)) / f"torch-{version}-cxx11abi1" / "libattncap_torch.so"
    assert built.exists(), stdout
    assert f"built the capture part for torch-{version}-cxx11abi1" in stdout


@pytest.mark.parametrize("job", list(JOBS))
def test_after_the_build_the_job_is_captured_unchanged_and_replays(job, parts, tmp_path):
    folder, _ = parts
    plain, plain_out, _ = run_job(job, tmp_path, "plain", preload=False)
    captured, captured_out, caps = run_job(job, tmp_path, "captured", preload=True, parts=folder)
    assert captured.returncode == 0 and plain.returncode == 0, captured.stderr
    assert same_outputs(plain_out, captured_out)
    assert not any("capture is off" in line for line in attncap_lines(captured.stderr)), captured.stderr
    files = capture_files(caps)
    assert len(files) == 1, captured.stderr
    calls = read_calls(files[0])
    # MiniLM: 6 layers on one batch; the decoder: 2 layers, a prefill and 3 decode steps of generate()
    # plus the forward pass for the logits.
    layers = {"minilm": 6, "decoder": 2}[job]
    assert len(calls) == {"minilm": 6, "decoder": 2 * 5}[job]
    # The labels, read from this Python's frames: each pass through the layers is one step.
    for index, call in enumerate(calls):
        metadata = call["metadata"]
        assert int(metadata["layer"]) == index % layers and int(metadata["step"]) == index // layers, metadata
        assert metadata["caller"] in ("BertSelfAttention", "BertSdpaSelfAttention", "LlamaAttention"), metadata
    report = tmp_path / "replay.json"
    run_attnreplay("run", files[0], "--kernels", "reference,torch-math", "--json", report, "-q", *FAST, check=0)
    record = load_json(report)
    assert len(record["calls"]) == len(calls)
    for call in record["calls"]:
        by_kernel = {k["kernel"]: k for k in call["kernels"]}
        assert by_kernel["model-output"]["error"]["rel_l2"] < 1e-5, call
