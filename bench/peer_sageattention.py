"""SageAttention2's own Hopper kernel and whole call beside attnreplay's kernels, same GPU, same call.

The issue's goals for `sage2-int8-fp8` are SageAttention2's speed, kernel against kernel and whole
call against whole call. To compare against the peer on this GPU, rather than against a figure
from another machine, this script builds SageAttention's sm90 attention extension and its
quantization extension (`csrc/fused`) from a source checkout (`--source`, not part of this
repository; bench/README.md says how to get one) with torch's JIT extension loader, and times:

- the attention kernel alone, on inputs already quantized, as SageAttention's own benchmark does:
  INT8 Q and K with per-thread or per-warp scales, e4m3 V with per-channel scales, fp32+fp32
  accumulation, bf16 output;
- the whole call a model makes, `sageattn_qk_int8_pv_fp8_cuda_sm90` from the checkout's Python
  package on bf16 HND inputs (K's mean, Q's and K's INT8, V's padding, transpose and FP8, the
  attention), checked against torch's attention before it is timed.

triton.testing.do_bench takes the median with the L2 flushed before each run; torch's FA2 backend is
timed the same way as the anchor. `attnreplay run` times torch's FA2 and cuDNN backends and
attnreplay's kernels on the same shapes: each kernel alone, and the quantized kinds also with their
input preparation (the whole call), with the preparation's memory-bandwidth bound; sage2-int8-fp8
once more under `--pv_accum_dtype fp32+fp16`.

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

from attnreplay_record import run_for_record

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
OURS = ["torch-flash", "torch-cudnn", "sage1-int8", "sage2-int8-fp8", "fa3-fp8"]
# SageAttention's --qk_quant_gran codes: 2 per_warp, 3 per_thread (its API's default).
GRANULARITIES = {"per_thread": 3, "per_warp": 2}
# Milliseconds of do_bench's warm-up and sampling; seconds of attnreplay's sampling: alike.
WARMUP_MS, SAMPLE_MS = 500, 1000


def work(b, h, s, d, causal):
    return 4.0 * b * h * s * s * d / (2 if causal else 1)


def build(source, build_dir):
    """SageAttention's sm90 attention extension and its quantization extension, as its setup.py
    compiles them: (qattn, fused) modules."""
    from torch.utils.cpp_extension import load

    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")  # wgmma needs sm_90a
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 4))
    cuda_flags = ["-O3", "-std=c++17", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
                  "--use_fast_math", "-diag-suppress=174"]
    modules = []
    for name, sources in [("peer_sage_qattn_sm90", ["qattn/pybind_sm90.cpp", "qattn/qk_int_sv_f8_cuda_sm90.cu"]),
                          ("peer_sage_fused", ["fused/pybind.cpp", "fused/fused.cu"])]:
        started = time.time()
        directory = build_dir / name
        directory.mkdir(parents=True, exist_ok=True)
        modules.append(load(name=name, sources=[str(source / "csrc" / f) for f in sources],
                            extra_cflags=["-O3", "-std=c++17"], extra_cuda_cflags=cuda_flags,
                            extra_ldflags=["-L/usr/local/cuda/lib64/stubs", "-lcuda"],
                            build_directory=str(directory), verbose=False))
        print(f"built SageAttention's {name} in {time.time() - started:.0f} s", flush=True)
    return tuple(modules)


def sage2_whole_call_function(source, qattn, fused):
    """SageAttention's own `sageattn_qk_int8_pv_fp8_cuda_sm90`, from the checkout's Python package,
    with the extensions just built standing where its setup.py would install them."""
    sys.modules["sageattention._qattn_sm90"] = qattn
    sys.modules["sageattention._fused"] = fused
    # Ahead of any installed sageattention (gpu.sh may install the 1.0.6 wheel, which lacks sm90).
    sys.path.insert(0, str(source.resolve()))
    import sageattention.core

    if not getattr(sageattention.core, "SM90_ENABLED", True):
        raise RuntimeError(f"{source}: sageattention.sm90_compile did not import")
    return sageattention.core.sageattn_qk_int8_pv_fp8_cuda_sm90


def sage2_whole_call(function, b, h, s, d, causal, granularity):
    """SageAttention2's whole call on bf16 HND inputs; its output is checked against torch's
    attention first, so that a broken build or a wrong argument is not timed."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    run = lambda: function(q, k, v, tensor_layout="HND", is_causal=causal, qk_quant_gran=granularity,
                           pv_accum_dtype="fp32+fp32", smooth_k=True)
    out = run().float()
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal).float()
    rel_l2 = ((out - expected).norm() / expected.norm()).item()
    del out, expected
    # Quantized attention on Gaussian inputs errs by a few per cent; a wrong layout or a broken
    # build by the order of the output itself.
    assert rel_l2 < 0.15, f"SageAttention2's whole call ({granularity}): relative L2 {rel_l2:.3f} against torch"
    return run, rel_l2


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


def attnreplay_run(binary, b, h, s, d, causal, run_ms, kernels, extra=()):
    """{kernel: figures} for `kernels`, each timed alone for about SAMPLE_MS after about WARMUP_MS
    of warm-up runs (`run_ms`: about one run's time), the quantized kinds also with their input
    preparation: TOPS and kernel time with their median SM clock, and for those the whole call's
    time and clock, the preparation's time, its memory-bandwidth bound and their ratio."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "r.json"
        arguments = ["run", "--shape", f"{b},{h},{s},{d}", "--dtype", "bf16", "--kernels", ",".join(kernels),
                     "--ref-sample-rows", "32", "-q",
                     "--warmup", str(max(3, math.ceil(WARMUP_MS / run_ms))), "--min-time", str(SAMPLE_MS / 1e3),
                     "--max-noise", "0", "--timeout", str(2 * SAMPLE_MS / 1e3), *extra]
        if causal:
            arguments.append("--causal")
        record, _ = run_for_record(binary, arguments, report, exits=(0,), capture_output=False)
        figures = {}
        for k in record["calls"][0]["kernels"]:
            alone = k.get("timing") or {}
            whole, preparation = k.get("timing_with_preparation") or {}, k.get("preparation") or {}
            ms = lambda seconds: seconds * 1e3 if seconds is not None else None
            figures[k["kernel"]] = {
                "status": k["status"], "tops": k.get("tflops"),
                "kernel_ms": ms(alone.get("median_s")), "kernel_mhz": alone.get("sm_clock_median_mhz"),
                "whole_ms": ms(whole.get("median_s")), "whole_mhz": whole.get("sm_clock_median_mhz"),
                "preparation_ms": ms(preparation.get("time_s")), "bound_ms": ms(preparation.get("bound_s")),
                "ratio_to_bound": preparation.get("ratio_to_bound")}
        return figures


def number(value, spec):
    return format(value, spec) if isinstance(value, (int, float)) and math.isfinite(value) else "-"


def print_whole_calls(rows):
    """The whole-call table: SageAttention2's whole call, attnreplay's quantized kinds with their
    preparation (and its ratio to the bound), torch's cuDNN backend; ms with the median SM clock."""
    print("\nWhole call in ms (median SM clock in MHz); prep: preparation ms / its ratio to the memory-bandwidth "
          "bound; speed-up: SageAttention2's whole call over sage2-int8-fp8's")
    print(f"{'shape':11} {'Sage2 per_thread':>17} {'Sage2 per_warp':>16} {'sage2-int8-fp8':>16} {'speed-up':>11} "
          f"{'sage2 prep':>13} {'sage1-int8':>16} {'sage1 prep':>13} {'fa3-fp8':>16} {'fa3 prep':>13} {'torch-cudnn':>16}")
    for row in rows:
        peer, ours = row["whole_call_ms"], row.get("attnreplay", {})
        cell = lambda ms, mhz: f"{number(ms, '.4f')} ({number(mhz, '.0f')})".rjust(16)
        mine = lambda kind: ours.get(kind, {})
        prep = lambda kind: f"{number(mine(kind).get('preparation_ms'), '.4f')}/{number(mine(kind).get('ratio_to_bound'), '.2f')}".rjust(13)
        sage2 = mine("sage2-int8-fp8").get("whole_ms")
        speedups = "/".join(number(peer[g]["ms"] / sage2 if sage2 else math.nan, ".2f") for g in GRANULARITIES)
        print(f"{row['shape']:11} {cell(peer['per_thread']['ms'], peer['per_thread']['mhz']):>17} "
              f"{cell(peer['per_warp']['ms'], peer['per_warp']['mhz'])} "
              f"{cell(sage2, mine('sage2-int8-fp8').get('whole_mhz'))} {speedups:>11} {prep('sage2-int8-fp8')} "
              f"{cell(mine('sage1-int8').get('whole_ms'), mine('sage1-int8').get('whole_mhz'))} {prep('sage1-int8')} "
              f"{cell(mine('fa3-fp8').get('whole_ms'), mine('fa3-fp8').get('whole_mhz'))} {prep('fa3-fp8')} "
              f"{cell(mine('torch-cudnn').get('kernel_ms'), mine('torch-cudnn').get('kernel_mhz'))}")
    print("\nsage2-int8-fp8's attention alone under each P·V accumulation, ms (MHz)")
    for row in rows:
        f32, f16 = row.get("attnreplay", {}).get("sage2-int8-fp8", {}), row.get("sage2_fp32_fp16", {})
        print(f"{row['shape']:11} fp32+fp32 {number(f32.get('kernel_ms'), '.4f')} ({number(f32.get('kernel_mhz'), '.0f')})"
              f"  fp32+fp16 {number(f16.get('kernel_ms'), '.4f')} ({number(f16.get('kernel_mhz'), '.0f')})  "
              f"ratio {number(f32['kernel_ms'] / f16['kernel_ms'] if f32.get('kernel_ms') and f16.get('kernel_ms') else math.nan, '.3f')}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True, help="a SageAttention source checkout")
    parser.add_argument("--build-dir", type=Path, default=Path("build-peer"))
    parser.add_argument("--attnreplay", help="attnreplay binary: time its kernels on the same shapes")
    parser.add_argument("--shapes", default="", help="comma-separated shape names (default: all): "
                        + ", ".join(shape[0] for shape in SHAPES))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--build-only", action="store_true", help="build the extensions (into --build-dir) and stop")
    args = parser.parse_args()
    if not args.build_only and not args.out:
        parser.error("--out is required unless --build-only")
    wanted = set(filter(None, args.shapes.split(",")))
    if wanted - {shape[0] for shape in SHAPES}:
        parser.error(f"--shapes: unknown {', '.join(sorted(wanted - {shape[0] for shape in SHAPES}))}")

    qattn, fused = build(args.source, args.build_dir)
    if args.build_only:
        return 0
    whole_call = sage2_whole_call_function(args.source, qattn, fused)
    clocks = ClockSampler()
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "timing": f"triton.testing.do_bench median over {SAMPLE_MS} ms after {WARMUP_MS} ms of warm-up, L2 "
                         f"flushed, with nvidia-smi's median SM clock over the samples; attnreplay: its CUDA-event "
                         f"median over at least {SAMPLE_MS} ms, L2 flushed, with its median SM clock (NVML)",
               "shapes": []}
    print("Kernel alone: TOPS, and in brackets the median SM clock in MHz while each was timed")
    print(f"{'shape':12} {'torch FA2':>12} {'Sage2 per_thread':>17} {'Sage2 per_warp':>15}   attnreplay: "
          + " ".join(OURS))
    for name, b, h, s, d, causal in SHAPES:
        if wanted and name not in wanted:
            continue
        flops = work(b, h, s, d, causal)
        row = {"shape": name, "batch": b, "heads": h, "seq": s, "head_dim": d, "causal": causal, "tops": {},
               "sm_clock_mhz": {}, "whole_call_ms": {}}

        def record(label, fn):
            median_ms, mhz = do_bench(fn, clocks)
            row["tops"][label] = flops / (median_ms * 1e-3) / 1e12
            row["sm_clock_mhz"][label] = mhz

        record("torch-flash (do_bench)", torch_flash(b, h, s, d, causal))
        for label, code in GRANULARITIES.items():
            record(f"sageattention2-sm90 {label}", sage2_kernel(qattn, b, h, s, d, causal, code))
            torch.cuda.empty_cache()
            run, rel_l2 = sage2_whole_call(whole_call, b, h, s, d, causal, label)
            median_ms, mhz = do_bench(run, clocks)
            row["whole_call_ms"][label] = {"ms": median_ms, "mhz": mhz, "rel_l2_against_torch": rel_l2}
            del run
            torch.cuda.empty_cache()
        if args.attnreplay:
            peer_ms = row["whole_call_ms"]["per_thread"]["ms"]
            row["attnreplay"] = attnreplay_run(args.attnreplay, b, h, s, d, causal, peer_ms, OURS)
            row["sage2_fp32_fp16"] = attnreplay_run(args.attnreplay, b, h, s, d, causal, peer_ms, ["sage2-int8-fp8"],
                                                    ["--pv_accum_dtype", "fp32+fp16"])["sage2-int8-fp8"]
        t, mhz = row["tops"], row["sm_clock_mhz"]
        cell = lambda label, width: f"{t[label]:.0f} ({mhz[label]:.0f})".rjust(width)
        ours = " ".join(f"{number(k.get('tops'), '.0f')} ({number(k.get('kernel_mhz'), '.0f')})"
                        for k in (row.get("attnreplay", {}).get(kind, {}) for kind in OURS))
        print(f"{name:12} {cell('torch-flash (do_bench)', 12)} {cell('sageattention2-sm90 per_thread', 17)} "
              f"{cell('sageattention2-sm90 per_warp', 15)}   {ours}", flush=True)
        results["shapes"].append(row)
        args.out.write_text(json.dumps(results, indent=2))  # after each shape: a timeout keeps what was measured
    clocks.stop()
    print_whole_calls(results["shapes"])


if __name__ == "__main__":
    sys.exit(main())
