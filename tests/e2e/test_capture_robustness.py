"""Capture when things go wrong, and its selection and output options: SIGKILL mid-capture, bad
configuration, unwritable folder, full disk, fork, ATTNCAP_CALLS/EVERY/MAX_CALLS/MAX_BYTES/OPS,
ATTNCAP_FORMAT=pt, deduplication, rank in the name, concurrent processes.

Most cases run tests/e2e/jobs/sdpa_loop_job.py, whose inputs are seeded: call i's Q, K, V are
regenerated here (loop_inputs) to check that what a file holds under index i is really call i.
"""

import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest

from capture_common import (FAST, JOBS, PYTHON, attncap_lines, attnreplay, capture_files, job_env, read_calls,
                            run_python_job, summary, the_capture)

LOOP = "sdpa_loop_job.py"
SHAPE = (1, 2, 16, 16)  # the loop job's default: 2 KiB per float32 tensor, 8 KiB per call with out


def loop_inputs(n, shape=SHAPE):
    """Q, K, V of the loop job's first n calls, as it makes them."""
    import torch

    g = torch.Generator().manual_seed(0)
    return [tuple(torch.randn(*shape, generator=g).numpy() for _ in range(3)) for _ in range(n)]


def assert_calls_are_the_jobs(calls, shape=SHAPE, outputs=None):
    """Each read-back call holds exactly the Q, K, V (and out) of the job's call of that index."""
    if not calls:
        return
    expected = loop_inputs(max(c["call_index"] for c in calls) + 1, shape)
    for c in calls:
        i = c["call_index"]
        for name, want in zip(("q", "k", "v"), expected[i]):
            assert np.array_equal(c[name], want), f"call {i}: '{name}' is not the job's (max {np.abs(c[name]).max()})"
        if outputs is not None:
            assert np.array_equal(c["out"], outputs[i]), f"call {i}: 'out' is not what the job got"


def info_call_count(path):
    result = attnreplay("info", path)
    m = re.search(r"attnreplay-hdf5 v2, (\d+) calls", result.stdout)
    assert m, result.stdout
    return int(m.group(1))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """The loop job's 8 calls without preload: the output every capture run must reproduce."""
    folder = tmp_path_factory.mktemp("baseline")
    result = run_python_job(LOOP, "--calls", "8", "--save", folder / "out.npy", preload=False)
    assert result.stdout == "".join(f"call {i}\n" for i in range(8))
    return dict(stdout=result.stdout, out=np.load(folder / "out.npy"))


def assert_job_unchanged(result, out_file, baseline):
    assert result.returncode == 0, result.stderr
    assert result.stdout == baseline["stdout"]
    assert np.load(out_file).tobytes() == baseline["out"].tobytes()


# ---------------------------------------------------------------------------------------------
# SIGKILL mid-capture: every call written (and flushed) before the kill reads back.


def visible_calls(path):
    """Calls a reader sees in a capture that is being written (SWMR read), 0 if not readable yet."""
    import h5py

    try:
        with h5py.File(path, "r", swmr=True) as f:
            return int(f["calls"].shape[0])
    except (OSError, KeyError):
        return 0


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("killed")
    shape = (2, 4, 64, 32)  # 64 KiB tensors: the writer has real work while the job goes on
    process = subprocess.Popen([PYTHON, JOBS / LOOP, "--calls", "0", "--shape", ",".join(map(str, shape))],
                               env=job_env(folder / "caps"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    printed = visible = 0
    deadline = time.monotonic() + 120
    try:
        for line in process.stdout:
            printed += line.startswith("call ")
            if printed >= 20 or time.monotonic() > deadline:
                break
        # Writing is asynchronous: on 2 busy cores the writer can be 15 calls behind the job. Kill
        # once a reader sees at least 15 written calls (the job keeps calling meanwhile), and
        # remember how many it saw: all of those must survive the kill.
        files = capture_files(folder / "caps")
        while files and time.monotonic() < deadline:
            visible = visible_calls(files[0])
            if visible >= 15:
                break
            time.sleep(0.01)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        process.stdout.close()
        process.stderr.close()
    assert printed >= 20, "the job did not make 20 calls"
    assert visible >= 15, f"the writer wrote only {visible} calls in 2 minutes"
    assert process.returncode == -signal.SIGKILL
    return dict(folder=folder, path=the_capture(folder / "caps"), shape=shape, visible=visible)


def test_killed_capture_reads_back_with_attnreplay_info(killed):
    # Every call a reader saw before the kill is still there after it.
    assert info_call_count(killed["path"]) >= killed["visible"] >= 15


def test_killed_capture_calls_hold_the_jobs_data(killed):
    calls = read_calls(killed["path"])
    assert len(calls) >= killed["visible"]
    assert [c["call_index"] for c in calls] == list(range(len(calls)))  # no gap, no half call
    assert_calls_are_the_jobs(calls, killed["shape"])


def test_killed_capture_replays(killed):
    result = attnreplay("run", killed["path"], "--kernels", "torch-flash-cpu", "-q", *FAST)
    m = re.search(r"(\d+) calls, (\d+) results", result.stdout)
    assert m and int(m.group(1)) >= 15, result.stdout
    assert "0 input errors" in result.stdout


# ---------------------------------------------------------------------------------------------
# Bad configuration: one message, capture off, the job as without preload.


@pytest.mark.parametrize("name,value", [("ATTNCAP_EVERY", "0"), ("ATTNCAP_FOO", "1"), ("ATTNCAP_OPS", "(")])
def test_bad_configuration_turns_capture_off_with_one_message(name, value, baseline, tmp_path):
    result = run_python_job(LOOP, "--calls", "8", "--save", tmp_path / "out.npy", out=tmp_path / "caps",
                            check=False, **{name: value})
    assert_job_unchanged(result, tmp_path / "out.npy", baseline)
    lines = attncap_lines(result.stderr)
    assert len(lines) == 1 and name in lines[0], result.stderr
    assert capture_files(tmp_path / "caps") == [] and not (tmp_path / "caps").exists()


def test_unwritable_output_is_reported_and_the_job_runs(baseline, tmp_path):
    result = run_python_job(LOOP, "--calls", "8", "--save", tmp_path / "out.npy", out="/proc/nope", check=False)
    assert_job_unchanged(result, tmp_path / "out.npy", baseline)
    lines = attncap_lines(result.stderr)
    assert len(lines) == 1 and "/proc/nope" in lines[0], result.stderr


# ---------------------------------------------------------------------------------------------
# Full disk: a 2 MiB tmpfs, a job writing 6 MiB of tensors.

FULL_SHAPE = (1, 4, 128, 64)  # 128 KiB per tensor, 512 KiB per call
FULL_CALLS = 12


@pytest.fixture(scope="module")
def full_disk(tmp_path_factory):
    folder = tmp_path_factory.mktemp("full_disk")
    mount_point = folder / "tmpfs"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs (needs root and mount permission): {mounted.stderr.strip()}")
    try:
        args = ["--calls", FULL_CALLS, "--shape", ",".join(map(str, FULL_SHAPE))]
        plain = run_python_job(LOOP, *args, "--save", folder / "plain.npy", preload=False)
        captured = run_python_job(LOOP, *args, "--save", folder / "captured.npy", out=mount_point / "caps",
                                  check=False)
        # Keep the file after unmounting: copy it out first.
        files = capture_files(mount_point / "caps")
        kept = []
        for path in files:
            target = folder / os.path.basename(path)
            target.write_bytes(open(path, "rb").read())
            kept.append(target)
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)
    return dict(folder=folder, plain=plain, captured=captured, files=kept)


def test_full_disk_job_runs_on_unchanged(full_disk):
    assert full_disk["captured"].returncode == 0, full_disk["captured"].stderr
    assert full_disk["captured"].stdout == full_disk["plain"].stdout
    plain, captured = np.load(full_disk["folder"] / "plain.npy"), np.load(full_disk["folder"] / "captured.npy")
    assert plain.tobytes() == captured.tobytes()


def test_full_disk_is_reported_once(full_disk):
    stopped = [line for line in attncap_lines(full_disk["captured"].stderr) if "capture stopped" in line]
    assert len(stopped) == 1, full_disk["captured"].stderr


def test_full_disk_does_not_dump_hdf5_error_stacks(full_disk):
    # docs/capture.md: a full disk is reported once on stderr, in capture's own words; HDF5's
    # automatic error stack (dozens of 'HDF5-DIAG' lines) must not land in the job's stderr.
    stderr = full_disk["captured"].stderr
    assert "HDF5-DIAG" not in stderr, stderr[:3000]


def written_before_full(full_disk):
    """The number of calls capture's message says were written before the disk filled."""
    m = re.search(r"the (\d+) calls written so far are kept", full_disk["captured"].stderr)
    assert m, full_disk["captured"].stderr
    written = int(m.group(1))
    assert 1 <= written < FULL_CALLS  # 2 MiB hold a few 512 KiB calls, not all 12
    return written


def test_full_disk_calls_written_before_read_back(full_disk):
    assert len(full_disk["files"]) == 1
    path = full_disk["files"][0]
    written = written_before_full(full_disk)
    assert info_call_count(path) >= written
    calls = read_calls(path)[:written]
    assert [c["call_index"] for c in calls] == list(range(written))
    assert_calls_are_the_jobs(calls, FULL_SHAPE, outputs=np.load(full_disk["folder"] / "plain.npy"))


def test_full_disk_file_holds_no_call_without_its_data(full_disk):
    # A call whose write failed must not show in the file: every call a reader sees must hold the
    # job's data, not chunks that never reached the disk (read back as zeros).
    path = full_disk["files"][0]
    calls = read_calls(path)
    assert_calls_are_the_jobs(calls, FULL_SHAPE, outputs=np.load(full_disk["folder"] / "plain.npy"))
    assert len(calls) == written_before_full(full_disk) == info_call_count(path)


# ---------------------------------------------------------------------------------------------
# fork(): capture is off in the child; the parent's file holds the parent's calls only.


def test_fork_child_is_not_captured_and_parent_goes_on(tmp_path):
    plain = run_python_job("fork_job.py", "--save", tmp_path / "plain.npy", preload=False, timeout=120)
    result = run_python_job("fork_job.py", "--save", tmp_path / "captured.npy", out=tmp_path / "caps",
                            timeout=120, check=False)
    # The job exits 1 if its child failed: both parent and child must exit 0.
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == sorted(plain.stdout.splitlines())
    assert np.load(tmp_path / "plain.npy").tobytes() == np.load(tmp_path / "captured.npy").tobytes()
    assert any("capture is off in forked child" in line for line in attncap_lines(result.stderr)), result.stderr
    calls = read_calls(the_capture(tmp_path / "caps"))  # one file: the child wrote none
    # The parent's 3 calls (8 tokens); the child's (5 tokens) nowhere.
    assert [c["q"].shape for c in calls] == [(1, 2, 8, 16)] * 3
    parent_pid = {c["metadata"]["pid"] for c in calls}
    assert len(parent_pid) == 1
    assert np.load(tmp_path / "captured.npy").tobytes() == np.stack([c["out"] for c in calls]).tobytes()


# ---------------------------------------------------------------------------------------------
# Selection: exactly the expected call indices of the loop job's 8 calls are in the file.

SELECTIONS = [
    ({"ATTNCAP_CALLS": "1-3"}, [1, 2, 3]),
    ({"ATTNCAP_CALLS": "0,5-6"}, [0, 5, 6]),
    ({"ATTNCAP_EVERY": "2"}, [0, 2, 4, 6]),
    ({"ATTNCAP_CALLS": "1-6", "ATTNCAP_EVERY": "3"}, [3, 6]),
    ({"ATTNCAP_MAX_CALLS": "2"}, [0, 1]),
    ({"ATTNCAP_MAX_BYTES": "20K"}, [0, 1]),  # 8 KiB per call: a third would pass 20 KiB
    ({"ATTNCAP_OPS": "no_such_attention_op"}, []),
    ({"ATTNCAP_OPS": "sdpa"}, list(range(8))),  # shorthand for scaled_dot_product
]


@pytest.mark.parametrize("settings,expected", SELECTIONS, ids=lambda v: ",".join(f"{k[8:]}={x}" for k, x in v.items())
                         if isinstance(v, dict) else None)
def test_selection_captures_exactly_the_expected_calls(settings, expected, baseline, tmp_path):
    result = run_python_job(LOOP, "--calls", "8", "--save", tmp_path / "out.npy", out=tmp_path / "caps", **settings)
    assert_job_unchanged(result, tmp_path / "out.npy", baseline)
    calls = read_calls(the_capture(tmp_path / "caps"))
    assert [c["call_index"] for c in calls] == expected, attncap_lines(result.stderr)
    assert_calls_are_the_jobs(calls, outputs=baseline["out"])
    counts = summary(result.stderr)
    assert counts and counts["captured"] == len(expected) and counts["failed"] == 0, counts


# ---------------------------------------------------------------------------------------------
# ATTNCAP_FORMAT=pt: a folder of .pt calls per process.


def test_pt_format_writes_a_folder_of_loadable_calls(tmp_path):
    import torch

    result = run_python_job(LOOP, "--calls", "3", out=tmp_path / "caps", ATTNCAP_FORMAT="pt")
    counts = summary(result.stderr)
    assert counts and counts["captured"] == 3 and counts["failed"] == 0, result.stderr
    folders = [p for p in (tmp_path / "caps").iterdir() if p.is_dir()] if (tmp_path / "caps").exists() else []
    assert len(folders) == 1 and folders[0].name.startswith("attncap-"), result.stderr
    files = sorted(folders[0].glob("*.pt"))
    assert [f.name for f in files] == ["call_000000.pt", "call_000001.pt", "call_000002.pt"]
    expected = loop_inputs(3)
    for i, f in enumerate(files):
        call = torch.load(f, weights_only=True)  # plain weights_only: no allow-listing needed
        for name, want in zip(("q", "k", "v"), expected[i]):
            assert np.array_equal(call[name].numpy(), want), (f.name, name)
    assert re.search(r"\b3 calls\b", attnreplay("info", folders[0]).stdout)


def test_safetensors_format_writes_a_folder_of_calls_hugging_faces_reader_reads(tmp_path):
    import json

    from safetensors import safe_open

    result = run_python_job(LOOP, "--calls", "3", out=tmp_path / "caps", ATTNCAP_FORMAT="safetensors")
    counts = summary(result.stderr)
    assert counts and counts["captured"] == 3 and counts["failed"] == 0, result.stderr
    (folder,) = [p for p in (tmp_path / "caps").iterdir() if p.is_dir()]
    files = sorted(folder.glob("*.safetensors"))
    assert [f.name for f in files] == ["call_000000.safetensors", "call_000001.safetensors", "call_000002.safetensors"]
    expected = loop_inputs(3)
    for i, f in enumerate(files):
        with safe_open(str(f), "pt") as st:
            (record,) = json.loads(st.metadata()["calls"])
            assert record["call_index"] == i and record["op"], record
            for name, want in zip(("q", "k", "v"), expected[i]):
                assert np.array_equal(st.get_tensor(f"call0.{name}").numpy(), want), (f.name, name)
    assert "folder of 3 attnreplay-safetensors v1 files, 3 calls" in attnreplay("info", folder).stdout
    replayed = attnreplay("run", folder, "--kernels", "reference", "--refcheck", "-q")
    # The reference and the output the model got, on each call.
    assert "3 calls, 6 results: 6 passed" in replayed.stdout, replayed.stdout


# ---------------------------------------------------------------------------------------------
# Deduplication: the same Q, K, V twice (and so the same output) are stored once.


def test_identical_tensors_are_stored_once(tmp_path):
    import h5py

    run_python_job(LOOP, "--calls", "2", "--same-inputs", out=tmp_path / "caps")
    path = the_capture(tmp_path / "caps")
    calls = read_calls(path)
    assert len(calls) == 2 and all(np.array_equal(calls[0][n], calls[1][n]) for n in ("q", "k", "v", "out"))
    numel = int(np.prod(SHAPE))
    with h5py.File(path, "r") as f:
        # q, k, v and out of the first call, once: 4 tensors, not 8.
        assert f["data/float32"].shape == (4 * numel,)
        rows = f["tensors"][()]
        offsets = {}
        for row in rows:
            offsets.setdefault(int(row["call_index"]), {})[row["name"].split(b"\0")[0].decode()] = int(row["offset"])
        assert offsets[0] == offsets[1]


# ---------------------------------------------------------------------------------------------
# Rank and concurrent processes.


def test_rank_goes_into_file_name_and_metadata(tmp_path):
    run_python_job(LOOP, "--calls", "1", out=tmp_path / "caps", RANK="3")
    path = the_capture(tmp_path / "caps")
    assert re.search(r"attncap-.+-\d+-\d{8}T\d{6}Z-rank3\.h5$", os.path.basename(path)), path
    assert [c["metadata"].get("rank") for c in read_calls(path)] == ["3"]


def test_concurrent_processes_write_separate_files(tmp_path):
    env = job_env(tmp_path / "caps")
    processes = [subprocess.Popen([PYTHON, JOBS / LOOP, "--calls", "5"], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=120) for p in processes]
    assert [p.returncode for p in processes] == [0, 0], [r[1] for r in results]
    files = capture_files(tmp_path / "caps")
    assert len(files) == 2, os.listdir(tmp_path / "caps")
    pids = set()
    for path in files:
        calls = read_calls(path)
        assert [c["call_index"] for c in calls] == list(range(5)), path
        assert_calls_are_the_jobs(calls)
        pids |= {c["metadata"]["pid"] for c in calls}
    assert pids == {str(p.pid) for p in processes}
