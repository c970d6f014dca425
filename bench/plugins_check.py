"""Plug-in kernels on the GPU, checked from outside attnreplay.

For every Python plug-in kernel that loads here (the library adapters whose packages import, and
the modules given), on each shape: attnreplay's median against triton.testing.do_bench of the very
same Python call (the kernel's run() on its prepared inputs), and attnreplay's error statistics
against the same statistics computed here, in fp64, from the kernel's own output.

    python bench/plugins_check.py --attnreplay build/replay/attnreplay --out plugins.json \
        --kernel-module examples/plugins/triton_flash.py
"""
import argparse
import json
import math
import os
import sys
import tempfile

import torch
import triton.testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "kernels", "python"), os.path.join(ROOT, "formats", "python")]
import attnreplay_h5  # noqa: E402
import attnreplay_plugin as ar  # noqa: E402
from attnreplay_record import run_for_record  # noqa: E402

# (flags, label): the peers' shapes, long enough that a kernel takes well over 50 us.
SHAPES = [
    (["--shape", "1,24,4608,128"], "flux"),
    (["--shape", "2,24,4250,64"], "4250-d64"),
    (["--shape", "1,32,4096,128", "--causal"], "4k-causal"),
    (["--shape", "1,32,4096,128", "--num_kv_heads", "8"], "4k-gqa"),
]
TIME_TOLERANCE = 0.03
STATS_TOLERANCE = 1e-6
MIN_TIMED_S = 50e-6


def spec_of(kernel, call):
    q, k, v = call["q"], call["k"], call["v"]
    bhsd = (lambda t: t) if call["layout"] == "bhsd" else (lambda t: t.transpose(1, 2))
    q, k, v = bhsd(q), bhsd(k), bhsd(v)
    fields = dict(index=call["call_index"], op=call["op"], dtype=str(q.dtype).replace("torch.", ""),
                  model_layout=call["layout"], batch=q.shape[0], heads_q=q.shape[1], heads_kv=k.shape[1],
                  seq_q=q.shape[2], seq_kv=k.shape[2], head_dim_qk=q.shape[3], head_dim_vo=v.shape[3],
                  is_causal=bool(call["is_causal"]), causal_alignment=call["causal_alignment"],
                  scale=call["scale"] if call["scale"] is not None else 1 / math.sqrt(q.shape[3]),
                  mask_kind=None, mask_shape=None, metadata=call["metadata"], quant={})
    return ar._make_spec(kernel, fields), q, k, v


def reference(q, k, v, spec):
    """softmax(QK^T * scale) V in fp64, a head at a time, as docs/metrics.md defines the reference."""
    out = torch.empty(q.shape[:3] + (v.shape[3],), dtype=torch.float64, device=q.device)
    group = spec.heads_q // spec.heads_kv
    shift = spec.seq_kv - spec.seq_q if spec.causal_alignment == "bottom_right" else 0
    for b in range(spec.batch):
        for h in range(spec.heads_q):
            s = (q[b, h].double() @ k[b, h // group].double().T) * spec.scale
            if spec.is_causal:
                keep = torch.ones_like(s, dtype=torch.bool).tril(shift)
                s = s.masked_fill(~keep, float("-inf"))
            out[b, h] = torch.softmax(s, dim=-1) @ v[b, h // group].double()
    return out


def statistics(output, ref):
    o, r = output.double().flatten(), ref.flatten()
    e = (o - r).abs()
    return {"max_abs": e.max().item(), "mean_abs": e.mean().item(),
            "rel_l2": (e.norm() / r.norm()).item(), "cosine": (o @ r / (o.norm() * r.norm())).item()}


def close(a, b):
    return abs(a - b) <= STATS_TOLERANCE * max(abs(a), abs(b), 1e-30) or abs(a - b) <= 1e-12


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attnreplay", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--kernel-module", action="append", default=[])
    args = parser.parse_args()

    for module in args.kernel_module:
        ar._load(module)
    for failure in ar._load_adapters(os.path.join(ROOT, "kernels", "adapters")):
        print("adapter failed:", failure)
    kernels = {entry.kernel.name: entry.kernel for entry in ar._registered}
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "kernels": sorted(kernels),
               "unavailable": dict(ar._unavailable_kernels()), "cases": []}
    print("plug-in kernels here:", ", ".join(sorted(kernels)))
    module_flags = [flag for m in args.kernel_module for flag in ("--kernel-module", m)]
    with tempfile.TemporaryDirectory() as folder:
        for flags, label in SHAPES:
            capture, report_path = os.path.join(folder, f"{label}.h5"), os.path.join(folder, f"{label}.json")
            report, _ = run_for_record(args.attnreplay, ["run", *flags, "--dtype", "bf16", "--kernels",
                                                         ",".join(sorted(kernels)), *module_flags, "--save-inputs",
                                                         capture, "-q", "--no-ceilings"],
                                       report_path, capture_output=False)
            call = attnreplay_h5.read_calls(capture, as_torch=True)[0]
            for key in ("q", "k", "v"):
                call[key] = call[key].cuda()
            for row in report["calls"][0]["kernels"]:
                case = {"shape": label, "kernel": row["kernel"], "status": row["status"], "reason": row["reason"]}
                results["cases"].append(case)
                if row["status"] != "not_verified":
                    print(f"{label:10} {row['kernel']:22} {row['status']}: {row['reason'][:100]}")
                    continue
                kernel = kernels[row["kernel"]]
                spec, q, k, v = spec_of(kernel, call)
                prepared = ar._Prepared(kernel, spec, q, k, v, None)
                with torch.no_grad():
                    median_ms = triton.testing.do_bench(prepared.run, warmup=100, rep=1000, return_mode="median")
                    prepared.run()
                torch.cuda.synchronize()
                mine = statistics(prepared.output_bhsd(), reference(q, k, v, spec))
                theirs = row["error"]
                case.update({
                    "attnreplay_median_s": row["timing"]["median_s"], "do_bench_median_s": median_ms * 1e-3,
                    "ratio": row["timing"]["median_s"] / (median_ms * 1e-3), "sm_clock_mhz": row["timing"].get("sm_clock_median_mhz"),
                    "tflops_attnreplay": row["tflops"], "stats_python": mine,
                    "stats_attnreplay": {key: theirs[key] for key in mine},
                })
                case["time_within_3pct"] = (abs(case["ratio"] - 1) <= TIME_TOLERANCE
                                            if case["do_bench_median_s"] >= MIN_TIMED_S else None)
                case["stats_equal"] = all(close(mine[key], theirs[key]) for key in mine)
                print(f"{label:10} {row['kernel']:22} attnreplay {row['timing']['median_s'] * 1e3:8.4f} ms  do_bench "
                      f"{median_ms:8.4f} ms  ratio {case['ratio']:.3f}  rel_l2 {theirs['rel_l2']:.3e} / "
                      f"{mine['rel_l2']:.3e}  stats equal: {case['stats_equal']}")
                del prepared
                torch.cuda.empty_cache()
    timed = [c for c in results["cases"] if "ratio" in c]
    results["passed"] = bool(timed) and all(c["stats_equal"] and c["time_within_3pct"] is not False for c in timed)
    json.dump(results, open(args.out, "w"), indent=2)
    print("passed" if results["passed"] else "FAILED")
    sys.exit(0 if results["passed"] else 1)


if __name__ == "__main__":
    main()
