#!/usr/bin/env python3
"""Whether a change left the CUDA kernels' outputs as they were, bit for bit.

Runs the same generated calls through two attnreplay builds (the change, and a base built from
the commit before it: `git archive <rev> | tar -x -C DIR`, built beside it) with `--save-outputs`,
and compares each kernel's outputs bit for bit. The cases cover both head dims and element
types, the three INT8 granularities, GQA, bshd, causal, sequences that end inside a block, and
values at the quantizers' edges.
Prints one line a case and kernel; exit status 1 if any differ.

  python3 bench/same_outputs.py --attnreplay build/replay/attnreplay --base /tmp/build-base/replay/attnreplay
"""
import argparse
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

CASES = [
    "--shape 1,24,4608,128",
    "--shape 2,24,4250,64",
    "--shape 4,32,1024,128 --causal",
    "--shape 1,4,300,64 --num_kv_heads 2 --causal",
    "--shape 2,4,1000,128 --dtype fp16 --quant_gran per_thread",
    "--shape 2,4,1000,64 --quant_gran per_thread --causal",
    "--shape 1,4,200,64 --s_kv 450 --num_kv_heads 1 --layout bshd --quant_gran per_block",
    "--shape 1,4,333,128 --layout bshd --quant_gran per_block --causal",
    "--shape 1,2,1,128 --s_kv 129",
    "--shape 1,2,65,64 --s_kv 12288 --dtype fp16",
    "--shape 16,32,512,64 --dtype fp16 --num_kv_heads 16",
    "--shape 1,2,64,128 --s_kv 16384",
    "--shape 1,2,64,64 --s_kv 131072",
    "--shape 2,4,100,128 --s_kv 9000 --num_kv_heads 2",
    "--shape 1,2,100,64 --s_kv 17776",
]


def special_values(path):
    """A bf16 call whose Q heads hold values the quantizers round at their edges: products below
    fp32's normal range (whose INT8 scale's inverse overflows), a head of zeros, huge values, and
    K and V rows of zeros."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 4, 200, 128, generator=g) for _ in range(3))
    q[0, 0] *= 1e-38
    q[0, 1] = 0
    q[0, 2] *= 1e15
    k[0, :, 5:9] = 0
    v[0, :, 10:20] = 0
    torch.save({"q": q.bfloat16(), "k": k.bfloat16(), "v": v.bfloat16()}, path)
    return str(path)


def outputs(binary, case, kernels, folder):
    command = [binary, "run", *shlex.split(case), "--kernels", kernels, "--save-outputs", str(folder),
               "--min-samples", "1", "--min-time", "0", "--no-ceilings", "-q"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    saved = {path.stem.split("_", 1)[1]: torch.load(path, weights_only=True)["out"] for path in folder.glob("*.pt")}
    if not saved:
        raise RuntimeError(f"{shlex.join(command)}: no outputs (exit {done.returncode})\n{done.stderr[-2000:]}")
    return saved


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attnreplay", required=True, help="the build with the change")
    parser.add_argument("--base", required=True, help="the build without it")
    parser.add_argument("--kernels", default="sage1-int8,sage2-int8-fp8,fa3-fp8")
    args = parser.parse_args()
    differing = 0
    inputs = tempfile.TemporaryDirectory()
    cases = CASES + [special_values(Path(inputs.name) / "special_values.pt")]
    for case in cases:
        with tempfile.TemporaryDirectory() as tmp:
            new = outputs(args.attnreplay, case, args.kernels, Path(tmp) / "new")
            base = outputs(args.base, case, args.kernels, Path(tmp) / "base")
        for kernel in args.kernels.split(","):
            if kernel not in new or kernel not in base:
                print(f"missing   {kernel} {case}")
                differing += 1
                continue
            # Bit patterns, so that NaNs compare equal to themselves.
            same = torch.equal(new[kernel].view(torch.int16), base[kernel].view(torch.int16))
            differing += not same
            detail = "" if same else f"  max diff {(new[kernel].float() - base[kernel].float()).abs().max().item():.3g}"
            print(f"{'same' if same else 'DIFFERENT':9} {kernel} {case}{detail}")
    print(f"{differing} of {len(cases) * len(args.kernels.split(','))} differ")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
