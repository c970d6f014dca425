"""What a replay costs beside what it measures: wall time against the time spent in timings.

Generates captures as folders of .pt calls (attnreplay's, bench/pt_calls.py; aiter's for the CPU):
- serving: a Llama-like model (16 layers of 32 query heads, 8 key/value heads, head dim 128, bf16)
  serving request batches, each a prefill and 15 decode steps through every layer: `--calls` calls
  (1,000: 63 forwards, so 63 shapes, as each decode step's key length is its own), left padding as
  a bool mask in the batches of several requests, causal prompts alone otherwise;
- flux: long calls, Flux's attention (1x24x(4096+128..512)x64 or 128, bf16), 12 calls of 6 shapes,
  replayed with --time-every-call (each call timed: the long calls' figure of wall against timing);
- aiter: for the CPU, 12 small calls in aiter's folder format (<kernel>_input_<n>.pt: sequences of
  200 to 607, 3 heads, head dim 64, bf16), as a video model's captured attention scaled down;
- decoder: a real capture: a transformers Llama (8 layers, GQA 32/8, head dim 128, bf16) computing
  the logits of 4 left-padded prompts (256 tokens and less) and generating 24 tokens on the GPU
  (tests/e2e/jobs/decoder_job.py), captured under the preload ($ATTNREPLAY_ATTNCAP_LIB) as users
  capture, to HDF5: 200 calls in 24 shapes, 3.7 GB (transformers hands SDPA K and V repeated to 32
  heads), a padding mask in every call; replayed with the default kernels (flex-attention among them) first with
  empty compile caches (torch's inductor and Triton caches in a new folder: "cold"), then again
  with the caches that run left ("warm").

Replays each through `--kernels` on 1 GPU, and on each count of `--gpus` (`attnreplay run --gpus
N`, or torchrun with --launcher torchrun), and reports per run: the wall time of the process(es),
the time its timings took (replay_seconds["measure"], summed over calls: the sampling loop, L2
flushes included), the GPU time its samples hold (the timings' measured_s), their ratios, the time
outside the calls' phases (on one GPU split into start-up before the first call, the calls' time
outside their phases, the gaps between calls, after the last call, and exit), (wall - start-up)
over the timings' time (the issue's bound: 1.25) and the speed-up over one GPU.

    python bench/replay_efficiency.py --attnreplay build/replay/attnreplay --out efficiency.json --gpus 1,2
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from attnreplay_record import read_record, record_command
from pt_calls import save_call

KERNELS = "torch-cudnn,torch-efficient,torch-flash,flash,sage2-int8-fp8"


def save_masked_call(folder, index, q, k, v, mask, is_causal, metadata):
    """save_call with a mask and metadata: the form capture writes for a transformers model's SDPA."""
    path = save_call(folder, index, q, k, v, is_causal=is_causal, op="aten::scaled_dot_product_attention")
    call = torch.load(path, weights_only=True)
    call.update({"mask": mask, "metadata": metadata, "enable_gqa": True})
    torch.save(call, path)
    return path


def write_serving_trace(folder, calls, seed, layers=16, heads_q=32, heads_kv=8, dim=128, decode_steps=15):
    """Request batches through a Llama-like model until `calls` attention calls: per batch a prefill
    (left-padded prompts under one bool mask, or one causal prompt) and `decode_steps` decode steps,
    each through every layer. Returns (calls written, distinct shapes)."""
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    index, shapes = 0, set()
    while index < calls:
        batch = rng.choice([1, 1, 2, 4])
        lengths = [rng.randint(48, 384) for _ in range(batch)]
        longest = max(lengths)
        for step in range(decode_steps + 1):
            seq_q = longest if step == 0 else 1
            seq_kv = longest + step
            shapes.add((batch, seq_q, seq_kv))
            # Left padding: a prompt's first (longest - length) keys are pads, in every step.
            mask = None
            if batch > 1:
                keys = torch.arange(seq_kv)
                queries = torch.arange(seq_kv - seq_q, seq_kv)
                visible = keys[None, :] <= queries[:, None]
                pads = torch.stack([keys >= longest - length for length in lengths])
                mask = (visible[None] & pads[:, None, :])[:, None]  # (b, 1, s_q, s_kv)
            for layer in range(layers):
                if index >= calls:
                    return index, len(shapes)
                q = torch.randn(batch, heads_q, seq_q, dim, generator=generator).to(torch.bfloat16)
                k = torch.randn(batch, heads_kv, seq_kv, dim, generator=generator).to(torch.bfloat16)
                v = torch.randn(batch, heads_kv, seq_kv, dim, generator=generator).to(torch.bfloat16)
                save_masked_call(folder, index, q, k, v, mask, is_causal=mask is None and seq_q > 1,
                                 metadata={"layer": str(layer), "step": str(step)})
                index += 1
    return index, len(shapes)


def write_flux_capture(folder, seed):
    """Flux's joint attention, 4096 image tokens and 128, 256 or 512 text tokens, 24 heads of 64 or
    128, bf16: 6 shapes, each twice (the issue's two-GPU run)."""
    os.makedirs(folder, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    index = 0
    for repeat in range(2):
        for text in (128, 256, 512):
            for dim in (64, 128):
                q, k, v = (torch.randn(1, 24, 4096 + text, dim, generator=generator).to(torch.bfloat16) for _ in range(3))
                save_masked_call(folder, index, q, k, v, None, False, {"text_tokens": str(text), "repeat": str(repeat)})
                index += 1
    return index, 6


def write_aiter_folder(folder, seed, calls=12):
    """aiter's capture form: query, key, value and the call's keyword arguments, one file a call."""
    os.makedirs(folder, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    for index in range(calls):
        seq = 200 + index * 37
        q, k, v = (torch.randn(1, 3, seq, 64, generator=generator).to(torch.bfloat16) for _ in range(3))
        torch.save({"query": q, "key": k, "value": v, "call_idx": index,
                    "kwargs": {"is_causal": False, "dropout_p": 0.0}},
                   os.path.join(folder, f"sdpa_input_{index}.pt"))
    return calls, calls


def capture_decoder(folder):
    """The decoder job captured on the GPU under the preload, as a user captures a model: (None,
    None), its calls and shapes counted from its replays' records."""
    job = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e", "jobs", "decoder_job.py")
    env = dict(os.environ, LD_PRELOAD=os.environ["ATTNREPLAY_ATTNCAP_LIB"], ATTNCAP_OUT=folder)
    subprocess.run([sys.executable, job, "--device", "cuda", "--dtype", "bfloat16", "--layers", "8", "--heads", "32",
                    "--kv-heads", "8", "--head-dim", "128", "--batch", "4", "--prompt", "256", "--pad-step", "24",
                    "--new-tokens", "24"], env=env, check=True)
    return None, None


def replay(binary, capture, kernels, gpus, work, extra, launcher, env=None, name=""):
    """One replay on `gpus` GPUs; returns its figures."""
    out = os.path.join(work, f"{os.path.basename(capture)}{name}-{gpus}gpu.json")
    flags = ["run", capture, *(["--kernels", kernels] if kernels else []), "-q", *extra]
    if gpus == 1:
        command = record_command(binary, flags, out)
    elif launcher == "torchrun":
        command = ["torchrun", "--standalone", f"--nproc-per-node={gpus}", "--no-python",
                   *record_command(binary, flags, out)]
    else:
        command = record_command(binary, [*flags, "--gpus", str(gpus)], out)
    start, start_epoch = time.perf_counter(), time.time()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    ended_epoch = time.time()
    record = read_record(result, out)
    timing_s = sum(call["replay_seconds"].get("measure", 0) for call in record["calls"])
    phases = {}
    for call in record["calls"]:
        for phase, seconds in call["replay_seconds"].items():
            phases[phase] = phases.get(phase, 0) + seconds
    sampled_s, timings, statuses, per_timing = 0.0, 0, {}, {}
    for call in record["calls"]:
        for kernel in call["kernels"]:
            statuses[kernel["status"]] = statuses.get(kernel["status"], 0) + 1
            for key in ("timing", "timing_with_preparation", "timing_of_preparation"):
                timing = kernel.get(key)
                if timing and not kernel.get("timing_shared_from"):
                    sampled_s += timing.get("measured_s") or 0
                    timings += 1
                    row = per_timing.setdefault(f"{kernel['kernel']}/{key}", {"timings": 0, "samples": 0, "sampled_s": 0.0, "stops": {}})
                    row["timings"] += 1
                    row["samples"] += timing.get("samples") or 0
                    row["sampled_s"] += timing.get("measured_s") or 0
                    reason = timing.get("stop_reason", "?")
                    row["stops"][reason] = row["stops"].get(reason, 0) + 1
    # Where the wall time went outside the timings (per process; "compare" is part of "judge"):
    # start-up before the first call, the calls' other phases, the gaps between calls, the time
    # from the last call to the record, and exit (wall less the record's time since the start).
    in_phases = sum(seconds for phase, seconds in phases.items() if phase != "compare")
    windows = [call["replay_at_s"] for call in record["calls"] if call.get("replay_at_s", {}).get("ended")]
    recorded = record.get("recorded_at_s") or 0
    wall_parts = {}
    if windows and recorded and gpus == 1:
        # Calls whose kernels waited (a library loading, compilations ahead) overlap later calls:
        # the time in calls is the union of their windows.
        in_calls, reach = 0.0, float("-inf")
        for w in sorted(windows, key=lambda w: w["began"]):
            start = max(w["began"], reach)
            if w["ended"] > start:
                in_calls += w["ended"] - start
            reach = max(reach, w["ended"])
        wall_parts = {"start_up": min(w["began"] for w in windows),
                      "in_calls_outside_phases": in_calls - in_phases,
                      "between_calls": max(w["ended"] for w in windows) - min(w["began"] for w in windows) - in_calls,
                      "after_calls": recorded - max(w["ended"] for w in windows),
                      "exit": wall - recorded}
        # The exit split at the record file's last write: writing the outputs, then the teardown
        # (libtorch's and CUDA's, at exit) until the process is gone.
        teardown = ended_epoch - os.path.getmtime(out)
        wall_parts["exit_writing"] = wall_parts["exit"] - teardown
        wall_parts["exit_teardown"] = teardown
    outside_s = wall - in_phases / gpus
    start_up = wall_parts.get("start_up")
    return {"gpus": gpus, "wall_s": wall, "outside_s": outside_s, "timing_s": timing_s, "timing_share": timing_s / (wall * gpus),
            # The issue's bound: wall time at most 1.25x the timings' time, plus start-up.
            "wall_less_start_up_per_timing_s": (wall - start_up) / timing_s if start_up is not None and timing_s else None,
            "wall_parts_s": wall_parts, "sampled_s": sampled_s, "timings": timings,
            "calls": len(record["calls"]), "input_errors": len(record["input_errors"]), "statuses": statuses,
            "phases_s": phases, "per_timing": per_timing, "exit": result.returncode,
            "shapes": len({json.dumps(call.get("shape"), sort_keys=True) for call in record["calls"]}),
            "compile_s": sum(k.get("compile_s") or 0 for call in record["calls"] for k in call["kernels"]),
            "compilations_ahead": record.get("compilations_ahead", []),
            # Each call's replay window (seconds since the process started): deferred calls overlap.
            "windows": [[call["call_index"], round(call["replay_at_s"]["began"], 3), round(call["replay_at_s"]["ended"], 3)]
                        for call in record["calls"] if call.get("replay_at_s", {}).get("ended")],
            "compile_s_by_call": {f"{call['call_index']} {k['kernel']}": k["compile_s"] for call in record["calls"]
                                  for k in call["kernels"] if k.get("compile_s")},
            # torch's word on any compilation it did again (TORCH_LOGS=recompiles, set for the decoder).
            "recompiles": [line for line in result.stderr.splitlines() if "ecompil" in line or " - " in line][:40]}


def print_run(run):
    print(f"{run['trace'] + run.get('cache', ''):<8} {run['calls']:>5} {run['shapes']:>6} {run['gpus']:>4} {run['wall_s']:>8.1f} "
          f"{run['timing_s']:>9.1f} {run['timing_share']:>11.2f} {run['sampled_s']:>9.2f} {run['timings']:>7} "
          f"{run['outside_s']:>9.2f} {(run['speed_up'] or 0):>8.2f}", flush=True)
    if run["wall_parts_s"]:
        print("         wall outside timings (s): " + ", ".join(f"{k} {v:.2f}" for k, v in run["wall_parts_s"].items()) +
              f"; (wall - start-up) / timing s = {run['wall_less_start_up_per_timing_s']:.2f} (goal <= 1.25)", flush=True)
    if run["compilations_ahead"] or run["compile_s"]:
        ahead = run["compilations_ahead"]
        print(f"         compiled ahead: {len(ahead)} kinds, {sum(c['seconds'] for c in ahead):.1f} s "
              f"({'; '.join(c['kernel'] + ': ' + c['kind'] for c in ahead)}); compile_s in calls: "
              f"{run['compile_s']:.2f} s {run['compile_s_by_call']}", flush=True)
        for line in run["recompiles"]:
            print("         " + line[-300:], flush=True)
    print("         phases (s, summed over calls): " +
          ", ".join(f"{k} {v:.1f}" for k, v in sorted(run["phases_s"].items(), key=lambda kv: -kv[1])), flush=True)
    for name, row in sorted(run["per_timing"].items()):
        print(f"         {name:<40} {row['timings']:>5} timings {row['samples'] / row['timings']:>8.0f} samples "
              f"{row['sampled_s'] / row['timings'] * 1e3:>8.2f} ms sampled each; stops {row['stops']}", flush=True)


def print_rounds(runs):
    """Per GPU count over the rounds: the median and range of the wall time, the speed-up and the bound."""
    for gpus in sorted({run["gpus"] for run in runs}):
        mine = [run for run in runs if run["gpus"] == gpus]
        line = f"{mine[0]['trace']:<8} {gpus} GPU(s), {len(mine)} rounds:"
        for key, label in (("wall_s", "wall s"), ("speed_up", "speed-up"),
                           ("wall_less_start_up_per_timing_s", "(wall - start-up) / timing s")):
            values = [run[key] for run in mine if run.get(key) is not None]
            if values:
                line += f" {label} median {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f});"
        print(line.rstrip(";"), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attnreplay", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--kernels", default=KERNELS, help="the kernels of the generated traces; the decoder's are "
                        "attnreplay's default")
    parser.add_argument("--calls", type=int, default=1000, help="calls of the serving trace")
    parser.add_argument("--gpus", default="1", help="GPU counts to replay on, comma-separated")
    parser.add_argument("--traces", default="serving,flux", help="serving, flux, decoder, aiter (the CPU's)")
    parser.add_argument("--extra", default="", help="more attnreplay run flags, e.g. '--stopping stdrel'")
    parser.add_argument("--launcher", choices=("gpus", "torchrun"), default="gpus",
                        help="how several GPUs' processes start: attnreplay run --gpus N, or torchrun")
    parser.add_argument("--work", help="folder for the captures (default: a temporary one, removed)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds of every replay (each round on 1 GPU, then the other counts): how long the "
                             "timings take varies run to run, and with it every ratio")
    args = parser.parse_args()

    work = args.work or tempfile.mkdtemp(prefix="replay-efficiency-")
    results = {"kernels": args.kernels, "extra": args.extra, "launcher": args.launcher, "runs": []}
    writers = {"serving": lambda folder: write_serving_trace(folder, args.calls, seed=1),
               "flux": lambda folder: write_flux_capture(folder, seed=2),
               "aiter": lambda folder: write_aiter_folder(folder, seed=3),
               "decoder": capture_decoder}
    # timing/wall: the share of the GPUs' wall time spent in timings (timing s over wall s x GPUs).
    print(f"{'trace':<8} {'calls':>5} {'shapes':>6} {'gpus':>4} {'wall s':>8} {'timing s':>9} {'timing/wall':>11} "
          f"{'sampled s':>9} {'timings':>7} {'outside s':>9} {'speed-up':>8}", flush=True)
    for trace in args.traces.split(","):
        folder = os.path.join(work, trace)
        start = time.perf_counter()
        calls, shapes = writers[trace](folder)
        written_s = time.perf_counter() - start
        print(f"{trace}: {calls if calls is not None else 'captured'} calls, {shapes} shapes written in "
              f"{written_s:.1f} s", flush=True)
        flags = args.extra.split() + (["--time-every-call"] if trace == "flux" else [])
        # The real capture replays as users replay it, with the default kernels; and first with
        # empty compile caches, then with those the cold run left.
        kernels = "" if trace == "decoder" else args.kernels
        caches = ("cold", "warm") if trace == "decoder" else ("",)
        for round_ in range(args.repeats):
            one_gpu_wall = None
            for gpus, cache in ((int(g), c) for g in args.gpus.split(",") for c in caches):
                env = None
                if cache:
                    folder_of_caches = os.path.join(work, f"compile-caches-{round_}-{gpus}")
                    if cache == "cold":
                        shutil.rmtree(folder_of_caches, ignore_errors=True)
                    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(folder_of_caches, "inductor"),
                               TRITON_CACHE_DIR=os.path.join(folder_of_caches, "triton"), TORCH_LOGS="recompiles")
                run = replay(args.attnreplay, folder, kernels, gpus, work, flags, args.launcher, env, "-" + cache)
                run.update({"trace": trace, "written_s": written_s, "round": round_, "cache": cache})
                if shapes is not None:
                    run["shapes"] = shapes
                one_gpu_wall = one_gpu_wall or (run["wall_s"] if gpus == 1 and cache != "warm" else None)
                run["speed_up"] = one_gpu_wall / run["wall_s"] if one_gpu_wall else None
                results["runs"].append(run)
                print_run(run)
                json.dump(results, open(args.out, "w"), indent=1)
        if args.repeats > 1:
            print_rounds([run for run in results["runs"] if run["trace"] == trace])
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
