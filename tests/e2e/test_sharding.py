"""Replay shared among processes (replay/run/sharding.h, docs/scaling.md): under each launcher's
variables two processes started here take their shares, rank 0 joins the parts, and the joined
record holds every call once with the error statistics a single process gives; `attnreplay merge`
refuses a missing, duplicated or foreign part, naming it."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import attnreplay_h5
from conftest import FAST, binary, load_json, run_attnreplay

KERNELS = "reference,torch-math"

LAUNCHERS = {
    "torchrun": lambda rank: {"RANK": rank, "WORLD_SIZE": 2, "LOCAL_RANK": rank, "TORCHELASTIC_RUN_ID": "t1"},
    "srun": lambda rank: {"SLURM_PROCID": rank, "SLURM_NTASKS": 2, "SLURM_LOCALID": rank, "SLURM_STEP_ID": 0,
                          "SLURM_JOB_ID": 77},
    "Open MPI": lambda rank: {"OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": 2,
                              "OMPI_COMM_WORLD_LOCAL_RANK": rank},
    "PMI": lambda rank: {"PMI_RANK": rank, "PMI_SIZE": 2, "MPI_LOCALRANKID": rank},
    "Slurm job array": lambda rank: {"SLURM_ARRAY_TASK_ID": 3 + 2 * rank, "SLURM_ARRAY_TASK_MIN": 3,
                                     "SLURM_ARRAY_TASK_STEP": 2, "SLURM_ARRAY_TASK_COUNT": 2,
                                     "SLURM_ARRAY_JOB_ID": 9},
}

# Variables of every launcher, cleared so that the machine running the tests adds none.
LAUNCHER_VARIABLES = {name for make in LAUNCHERS.values() for name in make(0)} | {
    "SLURM_STEP_NUM_TASKS", "PMI_LOCAL_RANK", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid", "OMPI_MCA_ess_base_jobid"}


def environment(extra):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def write_capture(path):
    """Ten calls in three shapes, one causal, of different sizes: enough to share out unevenly."""
    rng = np.random.default_rng(1)
    calls = []
    for index, (seq, causal) in enumerate([(64, False), (32, False), (64, False), (96, True), (32, False),
                                           (64, False), (96, True), (32, False), (64, False), (96, True)]):
        q, k, v = (rng.standard_normal((1, 2, seq, 16), dtype=np.float32) for _ in range(3))
        calls.append({"call_index": index, "q": q, "k": k, "v": v, "is_causal": causal})
    attnreplay_h5.write_calls(str(path), calls)


def start(args, extra, cwd):
    return subprocess.Popen([binary(), *map(str, args)], cwd=cwd, env=environment(extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(process, expected=0):
    out, err = process.communicate(timeout=300)
    assert process.returncode == expected, f"exit {process.returncode}\nstdout:\n{out}\nstderr:\n{err}"
    return out, err


def errors_by_call(record):
    return {(c["call_index"], k["kernel"]): k.get("error") for c in record["calls"] for k in c["kernels"]}


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    path = tmp_path_factory.mktemp("cap") / "cap.h5"
    write_capture(path)
    return path


@pytest.fixture(scope="module")
def one_process(capture, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "one.json"
    run_attnreplay("run", capture, "--kernels", KERNELS, "--json", out, "-q", *FAST, check=0)
    return load_json(out)


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_two_processes_share_the_calls_and_rank_0_joins_them(launcher, capture, one_process, tmp_path):
    args = ["run", capture, "--kernels", KERNELS, "--json", "r.json", "--csv", "r.csv", "-q", *FAST]
    processes = [start(args, LAUNCHERS[launcher](rank), tmp_path) for rank in (0, 1)]
    finish(processes[1])
    out, _ = finish(processes[0])
    assert "merged 2 parts: 10 calls" in out

    parts = [load_json(tmp_path / f"r.part{rank}-of-2.json") for rank in (0, 1)]
    shares = [[c["call_index"] for c in part["calls"]] for part in parts]
    assert shares[0] and shares[1] and sorted(shares[0] + shares[1]) == list(range(10))
    assert {part["shard"]["launcher"] for part in parts} == {launcher}

    joined = load_json(tmp_path / "r.json")
    assert "shard" not in joined and joined["sharded"]["world_size"] == 2
    # Each part's record time is on its own process's clock: in its entry, not the joined record's.
    assert "recorded_at_s" not in joined
    assert [p["recorded_at_s"] for p in joined["sharded"]["parts"]] == [part["recorded_at_s"] for part in parts]
    assert [c["call_index"] for c in joined["calls"]] == list(range(10))
    assert errors_by_call(joined) == errors_by_call(one_process)
    csv_lines = (tmp_path / "r.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + 10 * 2  # the header, then reference and torch-math per call


def test_the_share_out_is_balanced_and_keeps_timing_groups_together(capture, tmp_path):
    args = ["run", capture, "--kernels", KERNELS, "--json", "r.json", "-q", "--merge-wait", "0", *FAST]
    for rank in (0, 1):
        run_attnreplay(*args, "--shard", f"{rank}/2", cwd=tmp_path, check=0)
    parts = [load_json(tmp_path / f"r.part{rank}-of-2.json") for rank in (0, 1)]
    assert not (tmp_path / "r.json").exists()  # --merge-wait 0: left to attnreplay merge
    seq = {c["call_index"]: c["shape"]["seq_q"] for c in parts[0]["calls"] + parts[1]["calls"]}
    flops = [sum(c["work"]["flops"] for c in part["calls"]) for part in parts]
    assert max(flops) < 2.5 * min(flops), flops
    # Three shapes on two ranks: each shape's calls on one rank, timed once there.
    for part in parts:
        for shape in {seq[c["call_index"]] for c in part["calls"]}:
            assert all(seq[i] != shape for i in (c["call_index"] for c in parts[1 - part["shard"]["rank"]]["calls"]))
    merged = run_attnreplay("merge", tmp_path / "r.part1-of-2.json", tmp_path / "r.part0-of-2.json",
                            "--json", tmp_path / "m.json", check=0)
    assert "merged 2 parts: 10 calls" in merged.stdout
    assert [c["call_index"] for c in load_json(tmp_path / "m.json")["calls"]] == list(range(10))


def test_merge_names_a_missing_duplicated_or_foreign_part(capture, tmp_path):
    for rank in (0, 1, 2):
        run_attnreplay("run", capture, "--kernels", "reference", "--json", "r.json", "-q", "--shard", f"{rank}/3",
                       "--merge-wait", "0", *FAST, cwd=tmp_path, check=0)
    part = [tmp_path / f"r.part{rank}-of-3.json" for rank in range(3)]
    missing = run_attnreplay("merge", part[0], part[2], "--json", tmp_path / "m.json", check=1)
    assert f"1 of 3 parts missing: {part[1]}" in missing.stderr
    twice = run_attnreplay("merge", part[0], part[1], part[2], part[1], "--json", tmp_path / "m.json", check=1)
    assert f"{part[1]} and {part[1]} are both rank 1 of 3" in twice.stderr
    assert not (tmp_path / "m.json").exists()

    run_attnreplay("run", capture, "--kernels", "torch-math", "--json", "other.json", "-q", "--shard", "1/3",
                   "--merge-wait", "0", *FAST, cwd=tmp_path, check=0)
    foreign = run_attnreplay("merge", part[0], tmp_path / "other.part1-of-3.json", part[2], "--json",
                             tmp_path / "m.json", check=1)
    assert "parts of different runs (command line" in foreign.stderr

    run_attnreplay("run", capture, "--kernels", "reference", "--json", "whole.json", "-q", *FAST, cwd=tmp_path, check=0)
    whole = run_attnreplay("merge", tmp_path / "whole.json", "--json", tmp_path / "m.json", check=1)
    assert "not a part of a sharded run" in whole.stderr
    (tmp_path / "bad.json").write_text("{")
    assert "bad.json: not JSON" in run_attnreplay("merge", tmp_path / "bad.json", "--csv", tmp_path / "m.csv",
                                                 check=1).stderr
    run_attnreplay("merge", *part, check=2)  # nothing to write


def test_rank_0_names_the_parts_that_never_came(capture, tmp_path):
    result = run_attnreplay("run", capture, "--kernels", "reference", "--json", "r.json", "--shard", "0/2",
                            "--merge-wait", "1", *FAST, cwd=tmp_path, check=1)
    assert "1 of 2 parts have not appeared: r.part1-of-2.json" in result.stderr
    assert "attnreplay merge r.part*-of-2.json --json r.json" in result.stderr
    assert (tmp_path / "r.part0-of-2.json").exists()


def test_the_batch_script_of_a_slurm_job_is_one_process(capture, tmp_path):
    # sbatch's script sees SLURM_PROCID and SLURM_NTASKS too, but only srun's tasks share work.
    process = start(["run", capture, "--kernels", "reference", "--json", "r.json", "-q", *FAST],
                    {"SLURM_PROCID": 0, "SLURM_NTASKS": 4, "SLURM_JOB_ID": 5}, tmp_path)
    finish(process)
    assert len(load_json(tmp_path / "r.json")["calls"]) == 10
    assert not list(tmp_path.glob("r.part*"))


def test_bad_launcher_variables_and_audit_under_a_launcher_are_refused(capture, tmp_path):
    process = start(["run", capture, "--kernels", "reference", "-q", *FAST], {"RANK": 2, "WORLD_SIZE": 2}, tmp_path)
    _, err = finish(process, expected=2)
    assert "$RANK=2 is not below $WORLD_SIZE=2" in err
    process = start(["run", capture, "--kernels", "reference", "-q", "--shard", "3/2"], {}, tmp_path)
    assert "--shard: expected auto, none or RANK/SIZE" in finish(process, expected=2)[1]
    process = start(["audit", capture, "--kernels", "reference", "-q"], LAUNCHERS["torchrun"](1), tmp_path)
    assert "audit: started as rank 1 of 2 (torchrun" in finish(process, expected=2)[1]
    # --shard none: one process whatever the launcher says.
    process = start(["run", capture, "--kernels", "reference", "--json", "r.json", "-q", "--shard", "none", *FAST],
                    LAUNCHERS["torchrun"](1), tmp_path)
    finish(process)
    assert len(load_json(tmp_path / "r.json")["calls"]) == 10


def test_torchrun_starts_the_shares(capture, one_process, tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed beside this Python")
    result = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "--no-python", binary(), "run",
                             str(capture), "--kernels", KERNELS, "--json", "r.json", "-q", *FAST],
                            cwd=tmp_path, env=environment({}), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    joined = load_json(tmp_path / "r.json")
    assert joined["sharded"]["launcher"] == "torchrun" and joined["sharded"]["launch_id"].startswith("torchrun ")
    assert errors_by_call(joined) == errors_by_call(one_process)


def test_run_gpus_starts_its_own_ranks(capture, one_process, tmp_path):
    # On the CPU the two ranks share the machine's cores; on a GPU machine each takes its own GPU.
    process = start(["run", capture, "--kernels", KERNELS, "--json", "r.json", "-q", "--gpus", "2", *FAST], {}, tmp_path)
    out, _ = finish(process)
    assert "rank 1:" in out and "merged 2 parts: 10 calls" in out
    joined = load_json(tmp_path / "r.json")
    assert joined["sharded"]["launcher"] == "--gpus" and joined["sharded"]["launch_id"].startswith("pid ")
    assert errors_by_call(joined) == errors_by_call(one_process)
    # Under a launcher, or with no GPU to give, --gpus is refused before any work.
    process = start(["run", capture, "--kernels", "reference", "-q", "--gpus", "2"], LAUNCHERS["torchrun"](0), tmp_path)
    assert "give --gpus or a launcher, not both" in finish(process, expected=2)[1]
    process = start(["run", capture, "--kernels", "reference", "-q", "--gpus", "0"], {}, tmp_path)
    assert "--gpus: expected a number above 0, got '0'" in finish(process, expected=2)[1]
