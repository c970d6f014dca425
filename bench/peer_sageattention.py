"""SageAttention2's own Hopper kernel beside attnreplay's kernels, same GPU, same call.

The issue's goal for `sage2-int8-fp8` is SageAttention2's published speed. To compare against that
kernel on this GPU, rather than against a figure from another machine, this script builds
SageAttention's sm90 attention extension from a source checkout (`--source`, not part of this
repository; bench/README.md says how to get one) with torch's JIT extension loader, and times it
alone, on inputs already quantized, as SageAttention's own benchmark does: INT8 Q and K with
per-thread or per-warp scales, e4m3 V with per-channel scales, fp32+fp32 accumulation, bf16
output. triton.testing.do_bench takes the median with the L2 flushed before each run; torch's FA2
backend is timed the same way as the anchor, and `attnreplay run` times torch's FA2 and
attnreplay's kernels on the same shapes (kernel alone), so the two tools' anchors can be compared.

Both tools sample for about a second a kernel, after a warm-up of half a second or more: these
kernels hold an H100 at its power limit, and its SM clock falls from 1.98 GHz to about 1.6 within
that time, so a short measurement after an idle spell reads several per cent faster than a
sustained one. The SM clock is reported beside each figure, both read from the driver (NVML):
nvidia-smi's while do_bench samples, and attnreplay's own while its samples run.

    python bench/peer_sageattention.py --source .peer/SageAttention \
        --attnreplay build-gpu/replay/attnreplay --out peer.json
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import triton.testing

# (name, batch, heads, seq, head_dim, causal): the suite's shapes (bench/suite_quant.txt).
SHAPES = [
    ("Flux", 1, 24, 4608, 128, False),
    ("1k", 4, 32, 1024, 128, False),
    ("4k", 4, 32, 4096, 128, False),
    ("4k causal", 4, 32, 4096, 128, True),
    ("16k", 4, 32, 16384, 128, False),
    ("16k causal", 4, 32, 16384, 128, True),
    ("CogVideoX", 2, 30, 17776, 64, False),
    ("4250", 2, 24, 4250, 64, False),
]
OURS = ["torch-flash", "sage1-int8", "sage2-int8-fp8", "fa3-fp8"]
# SageAttention's --qk_quant_gran codes: 2 per_warp, 3 per_thread (its API's default).
GRANULARITIES = {"per_thread": 3, "per_warp": 2}
# Milliseconds of do_bench's warm-up and sampling; seconds of attnreplay's sampling: alike.
WARMUP_MS, SAMPLE_MS = 500, 1000


def work(b, h, s, d, causal):
    return 4.0 * b * h * s * s * d / (2 if causal else 1)


def build(source, build_dir):
    from torch.utils.cpp_extension import load

    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")  # wgmma needs sm_90a
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 4))
    build_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    module = load(
        name="peer_sage_qattn_sm90",
        sources=[str(source / "csrc/qattn/pybind_sm90.cpp"), str(source / "csrc/qattn/qk_int_sv_f8_cuda_sm90.cu")],
        extra_cflags=["-O3", "-std=c++17"],
        # As SageAttention's setup.py compiles it.
        extra_cuda_cflags=["-O3", "-std=c++17", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
                           "--use_fast_math", "-diag-suppress=174"],
        extra_ldflags=["-L/usr/local/cuda/lib64/stubs", "-lcuda"],
        build_directory=str(build_dir),
        verbose=False,
    )
    print(f"built SageAttention's sm90 extension in {time.time() - started:.0f} s", flush=True)
    return module


def sage2_kernel(module, b, h, s, d, causal, granularity):
    """The attention kernel alone, on inputs of SageAttention's layout (values do not matter for
    its speed beyond staying finite)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randint(-95, 95, (b, h, s, d), dtype=torch.int8, device="cuda", generator=g)
    k = torch.randint(-95, 95, (b, h, s, d), dtype=torch.int8, device="cuda", generator=g)
    padded = math.ceil(s / 128) * 128
    v = (torch.rand(b, h, d, padded, device="cuda", generator=g) * 2 - 1).to(torch.float8_e4m3fn)
    o = torch.empty(b, h, s, d, dtype=torch.bfloat16, device="cuda")
    warps = math.ceil(s / 64) * 4
    q_groups = warps * 8 if granularity == 3 else warps
    k_groups = math.ceil(s / 128) * (4 if granularity == 3 else 1)
    q_scale = torch.rand(b, h, q_groups, device="cuda", generator=g) * 1e-3 + 1e-4
    k_scale = torch.rand(b, h, k_groups, device="cuda", generator=g) * 1e-3 + 1e-4
    v_scale = torch.rand(b, h, d, device="cuda", generator=g) + 0.5
    sm_scale = d ** -0.5
    run = lambda: module.qk_int8_sv_f8_accum_f32_fuse_v_scale_attn_inst_buf(
        q, k, v, o, q_scale, k_scale, v_scale, 1, int(causal), granularity, sm_scale, 0)
    run()
    torch.cuda.synchronize()
    assert torch.isfinite(o.float()).all(), "SageAttention's kernel gave non-finite outputs"
    return run


def torch_flash(b, h, s, d, causal):
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    return lambda: torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)


class ClockSampler:
    """nvidia-smi's SM clock every 50 ms, in the background; clocks_between() picks a window."""

    def __init__(self):
        self.samples = []
        try:
            self.process = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits",
                                             "-lms", "50"], stdout=subprocess.PIPE, text=True)
        except OSError:
            self.process = None
            return
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            try:
                self.samples.append((time.monotonic(), float(line)))
            except ValueError:
                pass

    def median_between(self, start, end):
        clocks = [mhz for t, mhz in self.samples if start <= t <= end]
        return statistics.median(clocks) if clocks else float("nan")

    def stop(self):
        if self.process:
            self.process.terminate()


def do_bench(fn, clocks):
    """do_bench's median in ms over SAMPLE_MS, and nvidia-smi's median SM clock meanwhile."""
    fn()
    torch.cuda.synchronize()
    start = time.monotonic()
    median_ms = triton.testing.do_bench(fn, warmup=WARMUP_MS, rep=SAMPLE_MS, return_mode="median")
    # The window leaves out the warm-up: the clock of the samples, as attnreplay reports its own.
    return median_ms, clocks.median_between(start + WARMUP_MS / 1e3, time.monotonic())


def attnreplay_run(binary, b, h, s, d, causal, run_ms):
    """{kernel: (TOPS, its median SM clock)} for OURS, each kernel timed alone for about SAMPLE_MS
    after about WARMUP_MS of warm-up runs (`run_ms`: about one run's time)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "r.json"
        command = [binary, "run", "--shape", f"{b},{h},{s},{d}", "--dtype", "bf16", "--kernels", ",".join(OURS),
                   "--ref-sample-rows", "32", "--json", str(report), "-q",
                   "--warmup", str(max(3, math.ceil(WARMUP_MS / run_ms))), "--min-time", str(SAMPLE_MS / 1e3),
                   "--max-noise", "0", "--timeout", str(2 * SAMPLE_MS / 1e3)]
        if causal:
            command.append("--causal")
        subprocess.run(command, check=True)
        kernels = json.loads(report.read_text())["calls"][0]["kernels"]
        return {k["kernel"]: (k["tflops"], k["timing"]["sm_clock_median_mhz"] or float("nan")) for k in kernels}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True, help="a SageAttention source checkout")
    parser.add_argument("--build-dir", type=Path, default=Path("build-peer"))
    parser.add_argument("--attnreplay", help="attnreplay binary: time its kernels on the same shapes")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--build-only", action="store_true", help="build the extension (into --build-dir) and stop")
    args = parser.parse_args()
    if not args.build_only and not args.out:
        parser.error("--out is required unless --build-only")

    module = build(args.source, args.build_dir)
    if args.build_only:
        return 0
    clocks = ClockSampler()
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "timing": f"triton.testing.do_bench median over {SAMPLE_MS} ms after {WARMUP_MS} ms of warm-up, L2 "
                         f"flushed, with nvidia-smi's median SM clock over the samples; attnreplay: its CUDA-event "
                         f"median over at least {SAMPLE_MS} ms, L2 flushed, with its median SM clock (NVML)",
               "shapes": []}
    print("TOPS, and in brackets the median SM clock in MHz while each was timed")
    print(f"{'shape':12} {'torch FA2':>12} {'Sage2 per_thread':>17} {'Sage2 per_warp':>15}   attnreplay: "
          + " ".join(OURS))
    for name, b, h, s, d, causal in SHAPES:
        flops = work(b, h, s, d, causal)
        row = {"shape": name, "batch": b, "heads": h, "seq": s, "head_dim": d, "causal": causal, "tops": {},
               "sm_clock_mhz": {}}

        def record(label, fn):
            median_ms, mhz = do_bench(fn, clocks)
            row["tops"][label] = flops / (median_ms * 1e-3) / 1e12
            row["sm_clock_mhz"][label] = mhz

        record("torch-flash (do_bench)", torch_flash(b, h, s, d, causal))
        for label, code in GRANULARITIES.items():
            record(f"sageattention2-sm90 {label}", sage2_kernel(module, b, h, s, d, causal, code))
        torch.cuda.empty_cache()
        if args.attnreplay:
            peer_ms = flops / row["tops"]["sageattention2-sm90 per_thread"] / 1e9
            row["attnreplay"] = attnreplay_run(args.attnreplay, b, h, s, d, causal, peer_ms)
        t, mhz = row["tops"], row["sm_clock_mhz"]
        cell = lambda label, width: f"{t[label]:.0f} ({mhz[label]:.0f})".rjust(width)
        ours = " ".join("{:.0f} ({:.0f})".format(*row.get("attnreplay", {}).get(k, (math.nan, math.nan))) for k in OURS)
        print(f"{name:12} {cell('torch-flash (do_bench)', 12)} {cell('sageattention2-sm90 per_thread', 17)} "
              f"{cell('sageattention2-sm90 per_warp', 15)}   {ours}", flush=True)
        results["shapes"].append(row)
    clocks.stop()
    args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    sys.exit(main())
