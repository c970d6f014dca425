"""What capture costs the job it runs in. Two figures, each measured side by side in one run on
the same machine:

1. The preload's cost when capture records nothing, as a fraction of a model step. On the CPU:
   the real MiniLM model, where per-op overhead shows most, and a loop of tiny ops (the cost per
   op, with hooks only and with RecordFunction on). On the GPU (--device cuda): one Flux-sized
   transformer block, 1x24x4608x128 bf16. Runs alternate between no preload, a preload whose
   ATTNCAP_OPS matches no op, and one that hooks torch's attention ops but selects no call
   (ATTNCAP_CALLS past the end); per-step medians are compared.
2. The stall on the model's thread per captured GB, against the usual alternative (x.cpu() and
   torch.save inline): CPU, a loop of SDPA calls; GPU, the Flux block with every call captured.
3. A serving engine's paged decode loop (bench/jobs/paged_decode.py: vLLM's varlen_fwd over a
   paged cache in every layer of every step; on the GPU batch 32, 32 layers, GQA 32/8, d128, page
   16, 2k-token caches): step time without the preload, with it selecting no call, and with every
   call of one step captured, against the time its copies take on the job's stream.

    python bench/capture_overhead.py --attncap build/capture/libattncap.so --out results.json
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_job(args, preload=None, env_extra=None):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", ATTNCAP_QUIET="1")
    if preload:
        env["LD_PRELOAD"] = preload
    env.update(env_extra or {})
    result = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# What the preload is asked to do in each configuration compared with running without it.
NOTHING_MATCHES = {"ATTNCAP_OPS": "^matches-no-op$"}
NOTHING_SELECTED = {"ATTNCAP_CALLS": "1000000000"}  # torch's attention ops hooked, no call recorded


def alternate(job, rounds, configs, key):
    """Runs `job` once per configuration per round, alternating so that all share whatever the
    machine is doing; returns each configuration's samples (`key` of the job's JSON)."""
    samples = {name: [] for name in configs}
    for _ in range(rounds):
        for name, (preload, env, extra_args) in configs.items():
            env = dict(env, ATTNCAP_OUT=tempfile.mkdtemp()) if preload else env
            samples[name] += run_job(job + extra_args, preload, env)[key]
    return samples


def overheads(samples, baseline):
    base = statistics.median(samples[baseline])
    return {name: {"median": statistics.median(values), "samples": len(values),
                   "overhead_fraction": statistics.median(values) / base - 1.0}
            for name, values in samples.items()}


def preload_cost(attncap, rounds, steps):
    configs = {"without preload": (None, {}, []),
               "preload, ops match nothing": (attncap, NOTHING_MATCHES, []),
               "preload, attention ops hooked, no call selected": (attncap, NOTHING_SELECTED, [])}
    samples = alternate([str(HERE / "jobs/minilm_steps.py"), "--steps", str(steps)], rounds, configs, "step_s")
    return {"model": "all-MiniLM-L6-v2, batch of 4 sentences, CPU, 1 thread", "unit": "s per step",
            "configurations": overheads(samples, "without preload"), "goal_fraction": 0.01}


def per_op_cost(attncap, rounds):
    """Per-op cost on a loop of tiny ops, with hooks only and with RecordFunction turned on by an
    attention op registered after start (every run registers it, so only capture differs)."""
    configs = {"without preload": (None, {}, ["--late-op"]),
               "preload, attention ops hooked": (attncap, NOTHING_SELECTED, []),
               "preload, late op observed by RecordFunction": (attncap, NOTHING_SELECTED, ["--late-op"])}
    samples = alternate([str(HERE / "jobs/tiny_ops.py")], rounds, configs, "op_s")
    base = statistics.median(samples["without preload"])
    result = overheads(samples, "without preload")
    for name, values in samples.items():
        result[name]["added_us_per_op"] = (statistics.median(values) - base) * 1e6
    return {"job": "200k a + b on 1-element CPU tensors, inference_mode, 1 thread", "unit": "s per op",
            "configurations": result}


def capture_stall(attncap, calls, shape):
    job = [str(HERE / "jobs/sdpa_loop.py"), "--calls", str(calls), "--shape", shape]
    base = run_job(job)
    with tempfile.TemporaryDirectory() as folder:
        captured = run_job(job, attncap, {"ATTNCAP_OUT": folder})
    with tempfile.TemporaryDirectory() as folder:
        saved = run_job(job + ["--torch-save", folder])
    gigabytes = base["bytes_per_run"] / 1e9
    stall_capture = (captured["loop_s"] - base["loop_s"]) / gigabytes
    stall_save = (saved["loop_s"] - base["loop_s"]) / gigabytes
    return {"job": f"{calls} SDPA calls at {shape} float32, CPU", "captured_gb": gigabytes,
            "loop_s_plain": base["loop_s"], "loop_s_attncap": captured["loop_s"], "loop_s_torch_save": saved["loop_s"],
            "stall_s_per_gb_attncap": stall_capture, "stall_s_per_gb_torch_save": stall_save,
            "ratio_torch_save_to_attncap": stall_save / stall_capture if stall_capture > 0 else None,
            "goal_ratio": 10.0}


def gpu_figures(attncap, rounds, steps):
    job = [str(HERE / "jobs/flux_block.py"), "--steps", str(steps)]
    block = run_job(job + ["--steps", "1"])["block"]
    configs = {"without preload": (None, {}, []),
               "preload, ops match nothing": (attncap, NOTHING_MATCHES, []),
               "preload, attention ops hooked, no call selected": (attncap, NOTHING_SELECTED, [])}
    samples = alternate(job, rounds, configs, "step_s")
    # The stall is compared on the plain block, where the inline torch.save can be put.
    plain = job + ["--plain"]
    plain_base = run_job(plain)["step_s"]
    with tempfile.TemporaryDirectory() as folder:
        captured = run_job(plain, attncap, {"ATTNCAP_OUT": folder})["step_s"]
    with tempfile.TemporaryDirectory() as folder:
        saved = run_job(plain + ["--torch-save", folder])["step_s"]
    # q, k, v and the output of the block's one attention call, bf16
    gigabytes_per_step = 4 * 1 * 24 * 4608 * 128 * 2 / 1e9
    stall_capture = (statistics.median(captured) - statistics.median(plain_base)) / gigabytes_per_step
    stall_save = (statistics.median(saved) - statistics.median(plain_base)) / gigabytes_per_step
    return {
        "preload_cost": {"model": f"{block}, 1x4608 tokens, 24 heads x 128, bf16, GPU", "unit": "s per step",
                         "configurations": overheads(samples, "without preload"), "goal_fraction": 0.01},
        "capture_stall": {"job": "plain-torch Flux-sized block, every attention call captured",
                          "gb_per_step": gigabytes_per_step,
                          "median_step_s_plain": statistics.median(plain_base), "median_step_s_attncap": statistics.median(captured),
                          "median_step_s_torch_save": statistics.median(saved),
                          "stall_s_per_gb_attncap": stall_capture, "stall_s_per_gb_torch_save": stall_save,
                          "ratio_torch_save_to_attncap": stall_save / stall_capture if stall_capture > 0 else None,
                          "goal_ratio": 10.0}}


# The paged decode loop's sizes: the on the GPU, a small one on the CPU (a smoke run).
PAGED_DECODE_SIZES = {"cuda": [], "cpu": ["--batch", "4", "--layers", "4", "--heads", "4", "--kv-heads", "2",
                                          "--dim", "32", "--cache", "256"]}


def paged_decode_figures(attncap, device, rounds, steps):
    job = [str(HERE / "jobs/paged_decode.py"), "--device", device, "--steps", str(steps), *PAGED_DECODE_SIZES[device]]
    plain = run_job(job)  # the job's sizes, and a first sample of the step without the preload
    calls, warmup = plain["calls_per_step"], plain["warmup_steps"]
    configs = {"without preload": (None, {}, []),
               "preload, attention ops hooked, no call selected": (attncap, NOTHING_SELECTED, [])}
    samples = alternate(job, rounds, configs, "step_s")
    samples["without preload"] += plain["step_s"]
    off = statistics.median(samples["without preload"])
    # Every call of one step captured (the third timed one), into memory where there is a
    # /dev/shm, so that a disk does not set the run's length: a step's copies must fit capture's
    # queue, so that the job never waits for the writer. That step's time against a step's without
    # capture plus what its copies cost on the job's stream.
    first = (warmup + 2) * calls
    queue = max(4 << 30, 2 * calls * plain["bytes_per_call"])
    captured = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as folder:
            result = run_job(job, attncap, {"ATTNCAP_OUT": folder, "ATTNCAP_CALLS": f"{first}-{first + calls - 1}",
                                            "ATTNCAP_QUEUE_BYTES": str(queue)})
            captured.append(result["step_s"][2])
    copies_s = calls * plain["bytes_per_call"] / (plain["clone_gb_per_s"] * 1e9)
    on = statistics.median(captured)
    nothing = statistics.median(samples["preload, attention ops hooked, no call selected"])
    return {"job": f"paged decode loop, {calls} varlen_fwd calls a step, {plain['device']}",
            "bytes_per_call": plain["bytes_per_call"], "clone_gb_per_s": plain["clone_gb_per_s"],
            "median_step_s_off": off, "median_step_s_nothing_selected": nothing,
            "step_s_captured": captured, "copies_s_per_step": copies_s,
            "ratio_nothing_selected": nothing / off, "goal_ratio_nothing_selected": 1.02,
            "ratio_captured_to_off_plus_copies": on / (off + copies_s), "goal_ratio_captured": 1.1,
            "configurations": overheads(samples, "without preload")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attncap", required=True, help="path of libattncap.so")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--calls", type=int, default=64)
    parser.add_argument("--shape", default="1,8,1024,64")
    parser.add_argument("--paged-decode-only", action="store_true", help="only the paged decode loop's figures")
    parser.add_argument("--out", help="write the results here as JSON")
    args = parser.parse_args()
    attncap = str(Path(args.attncap).resolve())
    results = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                           "python": platform.python_version()}}
    if args.paged_decode_only:
        pass
    elif args.device == "cuda":
        import torch
        results["machine"]["gpu"] = torch.cuda.get_device_name()
        results.update(gpu_figures(attncap, args.rounds, args.steps))
    else:
        results["preload_cost"] = preload_cost(attncap, args.rounds, args.steps)
        results["per_op_cost"] = per_op_cost(attncap, args.rounds)
        results["capture_stall"] = capture_stall(attncap, args.calls, args.shape)
    results["paged_decode"] = paged_decode_figures(attncap, args.device, args.rounds, min(args.steps, 20))
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
