"""What capture costs the job it runs in. Two figures, each measured side by side in one run on
the same machine:

1. The preload's cost when capture matches nothing, as a fraction of a model step. On the CPU:
   the real MiniLM model, where per-op overhead shows most. On the GPU (--device cuda): one
   Flux-sized transformer block, 1x24x4608x128 bf16. Runs alternate between without the preload
   and with it (ATTNCAP_OPS matching no op), and per-step medians are compared.
2. The stall on the model's thread per captured GB, against the usual alternative (x.cpu() and
   torch.save inline): CPU, a loop of SDPA calls; GPU, the Flux block with every call captured.

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


def preload_cost(attncap, rounds, steps):
    without, with_preload = [], []
    for _ in range(rounds):
        # Alternating runs share whatever the machine is doing at the time.
        without += run_job([str(HERE / "jobs/minilm_steps.py"), "--steps", str(steps)])["step_s"]
        with_preload += run_job([str(HERE / "jobs/minilm_steps.py"), "--steps", str(steps)], attncap,
                                {"ATTNCAP_OPS": "^matches-no-op$", "ATTNCAP_OUT": tempfile.mkdtemp()})["step_s"]
    base, hooked = statistics.median(without), statistics.median(with_preload)
    return {"model": "all-MiniLM-L6-v2, batch of 4 sentences, CPU, 1 thread",
            "steps_each": len(without), "median_step_s_without": base, "median_step_s_with_preload": hooked,
            "overhead_fraction": hooked / base - 1.0, "goal_fraction": 0.01}


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
    without, with_preload, captured, saved = [], [], [], []
    block = None
    for _ in range(rounds):
        result = run_job(job)
        block = result["block"]
        without += result["step_s"]
        with_preload += run_job(job, attncap, {"ATTNCAP_OPS": "^matches-no-op$",
                                               "ATTNCAP_OUT": tempfile.mkdtemp()})["step_s"]
    # The stall is compared on the plain block, where the inline torch.save can be put.
    plain = job + ["--plain"]
    plain_base = run_job(plain)["step_s"]
    with tempfile.TemporaryDirectory() as folder:
        captured = run_job(plain, attncap, {"ATTNCAP_OUT": folder})["step_s"]
    with tempfile.TemporaryDirectory() as folder:
        saved = run_job(plain + ["--torch-save", folder])["step_s"]
    base = statistics.median(without)
    # q, k, v and the output of the block's one attention call, bf16
    gigabytes_per_step = 4 * 1 * 24 * 4608 * 128 * 2 / 1e9
    stall_capture = (statistics.median(captured) - statistics.median(plain_base)) / gigabytes_per_step
    stall_save = (statistics.median(saved) - statistics.median(plain_base)) / gigabytes_per_step
    return {
        "preload_cost": {"model": f"{block}, 1x4608 tokens, 24 heads x 128, bf16, GPU",
                         "steps_each": len(without), "median_step_s_without": base,
                         "median_step_s_with_preload": statistics.median(with_preload),
                         "overhead_fraction": statistics.median(with_preload) / base - 1.0, "goal_fraction": 0.01},
        "capture_stall": {"job": "plain-torch Flux-sized block, every attention call captured",
                          "gb_per_step": gigabytes_per_step,
                          "median_step_s_plain": statistics.median(plain_base), "median_step_s_attncap": statistics.median(captured),
                          "median_step_s_torch_save": statistics.median(saved),
                          "stall_s_per_gb_attncap": stall_capture, "stall_s_per_gb_torch_save": stall_save,
                          "ratio_torch_save_to_attncap": stall_save / stall_capture if stall_capture > 0 else None,
                          "goal_ratio": 10.0}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attncap", required=True, help="path of libattncap.so")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--calls", type=int, default=64)
    parser.add_argument("--shape", default="1,8,1024,64")
    parser.add_argument("--out", help="write the results here as JSON")
    args = parser.parse_args()
    attncap = str(Path(args.attncap).resolve())
    results = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                           "python": platform.python_version()}}
    if args.device == "cuda":
        import torch
        results["machine"]["gpu"] = torch.cuda.get_device_name()
        results.update(gpu_figures(attncap, args.rounds, args.steps))
    else:
        results["preload_cost"] = preload_cost(attncap, args.rounds, args.steps)
        results["capture_stall"] = capture_stall(attncap, args.calls, args.shape)
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
