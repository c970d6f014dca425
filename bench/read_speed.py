"""How fast attnreplay reads captures, beside torch.load reading the same files.

Writes a folder of aiter-style .pt calls (`--calls` of `--shape`, bf16, query/key/value, about 80 MB
each at the default) and the same calls as one HDF5 capture and as one safetensors file, then, with the page cache warm (each
read once before it is timed), times:
- torch.load of every file (weights_only=True, as attnreplay's readers never run pickled code), in
  this process and as a process of its own (Python and `import torch` included);
- `attnreplay info` (headers only) and `attnreplay info --verify` (every call read whole) of the
  folder, of the HDF5 file and of the safetensors file, as processes; and the reading itself, as
  `info --verify` times it in its process ("read whole: ... s"), set beside torch.load in this process.
Each is the fastest of `--repeats` runs.

    python bench/read_speed.py --attnreplay build/replay/attnreplay --out read_speed.json
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch


def fastest(function, repeats):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best


def run(command):
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return result.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attnreplay", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--calls", type=int, default=6)
    parser.add_argument("--shape", default="2,30,3520,64", help="batch,heads,seq,head_dim of each call")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="read-speed-")
    folder = os.path.join(work, "calls")
    os.makedirs(folder)
    b, h, s, d = (int(x) for x in args.shape.split(","))
    generator = torch.Generator().manual_seed(0)
    files = []
    for index in range(args.calls):
        q, k, v = (torch.randn(b, h, s, d, generator=generator).to(torch.bfloat16) for _ in range(3))
        path = os.path.join(folder, f"sdpa_input_{index}.pt")
        torch.save({"query": q, "key": k, "value": v, "call_idx": index, "kwargs": {"is_causal": False}}, path)
        files.append(path)
    total = sum(os.path.getsize(f) for f in files)
    h5 = os.path.join(work, "calls.h5")
    run([args.attnreplay, "convert", folder, h5])
    safetensors = os.path.join(work, "calls.safetensors")
    run([args.attnreplay, "convert", folder, safetensors])
    formats = (("pt_folder", folder, ".pt folder"), ("hdf5", h5, "HDF5"), ("safetensors", safetensors, "safetensors"))

    def torch_load_all():
        for f in files:
            torch.load(f, weights_only=True)

    results = {"calls": args.calls, "shape": args.shape, "bytes": total}
    torch_load_all()  # the page cache warm
    results["torch_load_s"] = fastest(torch_load_all, args.repeats)
    script = f"import torch\nfor f in {files!r}: torch.load(f, weights_only=True)"
    results["torch_load_process_s"] = fastest(lambda: run([sys.executable, "-c", script]), args.repeats)
    for name, target, _ in formats:
        run([args.attnreplay, "info", "--verify", target])
        results[f"{name}_info_s"] = fastest(lambda: run([args.attnreplay, "info", target]), args.repeats)
        results[f"{name}_verify_s"] = fastest(lambda: run([args.attnreplay, "info", "--verify", target]), args.repeats)
        readings = []
        for _ in range(args.repeats):
            line = next(l for l in run([args.attnreplay, "info", "--verify", target]).splitlines() if "read whole:" in l)
            readings.append(float(line.split(" in ")[1].split(" s")[0]))
        results[f"{name}_read_s"] = min(readings)
    for name, target, _ in formats:
        size = total if name == "pt_folder" else os.path.getsize(target)
        reading = results[f"{name}_read_s"]
        results[f"{name}_gb_per_s"] = size / reading / 1e9
    results["pt_folder_read_over_torch_load"] = results["pt_folder_read_s"] / results["torch_load_s"]
    results["pt_folder_verify_over_torch_load_process"] = results["pt_folder_verify_s"] / results["torch_load_process_s"]
    results["safetensors_read_over_hdf5"] = results["safetensors_read_s"] / results["hdf5_read_s"]
    json.dump(results, open(args.out, "w"), indent=1)
    print(f"{args.calls} calls of {args.shape}, {total / 1e6:.0f} MB as .pt files; fastest of {args.repeats}, page cache warm")
    print(f"  torch.load of every file, in this process      {results['torch_load_s']:7.3f} s")
    print(f"  the same as a process (python, import torch)   {results['torch_load_process_s']:7.3f} s")
    for name, _, label in formats:
        print(f"  attnreplay info, {label:<11} headers only        {results[f'{name}_info_s']:7.3f} s")
        print(f"  attnreplay info --verify, {label:<11} (whole)   {results[f'{name}_verify_s']:7.3f} s: reading "
              f"{results[f'{name}_read_s']:.3f} s, {results[f'{name}_gb_per_s']:.2f} GB/s")
    print(f"  .pt reading over torch.load in-process: {results['pt_folder_read_over_torch_load']:.2f}x; "
          f"info --verify over torch.load as a process: {results['pt_folder_verify_over_torch_load_process']:.2f}x")
    print(f"  safetensors reading over HDF5 reading: {results['safetensors_read_over_hdf5']:.2f}x")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
