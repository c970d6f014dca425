"""Each library adapter's headline time against triton.testing.do_bench of the library's own call.

An adapter's headline is the library's function as users call it (KernelDescription::Headline):
`sageattn(q, k, v, tensor_layout="HND", is_causal=..., sm_scale=...)` whole, K smoothing inside;
for flex-attention, the adapter's own compiled callable (torch.compile'd with dynamic sequence
lengths, its block mask built once, as a model does): the adapter's run() on its prepare()'s inputs,
which is what attnreplay times. On the same GPU, same inputs, both with a cold L2, the two medians
must agree within 3 %. attnreplay is
run with its default timer and with `--timing queued` (do_bench's own way of sampling: where a
call's launches take longer on the host than its kernels on the GPU, do_bench counts the gaps,
which the default timer's pipelined samples hide). Adapters whose library is not installed are
listed as such.

    python bench/adapter_headline_check.py --attnreplay build/replay/attnreplay --out adapters.json
"""
import argparse
import json
import os
import sys
import tempfile
import time

import torch
import triton.testing

from attnreplay_record import run_for_record

# (batch, heads, seq, head_dim, dtype, causal): the shape, Flux, SageAttention's sweep, a causal bf16 one.
SHAPES = [(2, 16, 2048, 64, torch.float16, True), (1, 24, 4608, 128, torch.bfloat16, False),
          (4, 32, 1024, 128, torch.float16, False), (2, 16, 4096, 128, torch.bfloat16, True)]
DTYPE_FLAGS = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def sageattn_call():
    try:
        import sageattention
    except ImportError as error:
        return None, f"sageattention does not import: {error}"

    def call(q, k, v, causal, scale):
        return sageattention.sageattn(q, k, v, tensor_layout="HND", is_causal=causal, sm_scale=scale)
    return call, None


def flex_call():
    """The adapter's compiled callable itself: its prepare() once per call, then its run()."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    for folder in ("kernels/python", "kernels/adapters"):
        sys.path.insert(0, os.path.join(root, folder))
    import attnreplay_plugin as ar
    import flex_attention_adapter

    if flex_attention_adapter.flex is None:
        return None, "flex_attention does not import"
    kernel = flex_attention_adapter.FlexAttention()
    prepared = {}

    def call(q, k, v, causal, scale):
        key = (q.data_ptr(), k.data_ptr(), causal)
        if key not in prepared:  # prepared once per call, as attnreplay prepares it
            batch, heads, seq, dim = q.shape
            fields = {"index": 0, "op": "bench", "dtype": str(q.dtype).replace("torch.", ""), "model_layout": "bhsd",
                      "batch": batch, "heads_q": heads, "heads_kv": k.shape[1], "seq_q": seq, "seq_kv": k.shape[2],
                      "head_dim_qk": dim, "head_dim_vo": v.shape[3], "is_causal": causal,
                      "causal_alignment": "top_left", "scale": scale, "mask_kind": None, "mask_shape": None,
                      "metadata": {}, "quant": {}}
            spec = ar._make_spec(kernel, fields)
            prepared[key] = kernel.prepare(ar.Inputs(q, k, v, None, spec))
            kernel.warm_up(prepared[key])
        return kernel.run(prepared[key])
    return call, None


ADAPTERS = {"sageattn-triton": sageattn_call, "flex-attention": flex_call}


def attnreplay_headline(binary, shape, kernel, timing):
    batch, heads, seq, dim, dtype, causal = shape
    with tempfile.NamedTemporaryFile(suffix=".json") as report:
        arguments = ["run", "--shape", f"{batch},{heads},{seq},{dim}", "--dtype", DTYPE_FLAGS[dtype],
                     "--kernels", kernel, "-q", "--no-ceilings", "--timing", timing]
        arguments += ["--causal"] if causal else []
        replay, _ = run_for_record(binary, arguments, report.name, capture_output=False)
    row = replay["calls"][0]["kernels"][0]
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attnreplay", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tolerance", type=float, default=0.03)
    parser.add_argument("--shapes", default="", help="indices into SHAPES to run, comma-separated (default: all)")
    args = parser.parse_args()
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "adapters": {}}
    for kernel, make in ADAPTERS.items():
        call, missing = make()
        if call is None:
            results["adapters"][kernel] = {"not_installed": missing}
            continue
        rows = []
        chosen = [SHAPES[int(i)] for i in args.shapes.split(",")] if args.shapes else SHAPES
        for shape in chosen:
            batch, heads, seq, dim, dtype, causal = shape
            torch.manual_seed(0)
            q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=dtype) for _ in range(3))
            scale = dim ** -0.5
            call(q, k.clone(), v, causal, scale)  # compiles, autotunes
            # sageattn 1.0.x subtracts K's mean from the K it is given: each sample gets the same K.
            median_ms = triton.testing.do_bench(lambda: call(q, k, v, causal, scale), warmup=100, rep=1000,
                                                return_mode="median")
            # The host's time per call, launches queued without waiting: where it exceeds the GPU's,
            # do_bench's figure is the host's.
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(200):
                call(q, k, v, causal, scale)
            host_ms = (time.perf_counter() - start) / 200 * 1e3
            torch.cuda.synchronize()
            entry = {"shape": [batch, heads, seq, dim], "dtype": str(dtype).replace("torch.", ""), "causal": causal,
                     "do_bench_median_s": median_ms * 1e-3, "host_s_per_call": host_ms * 1e-3}
            line = (f"{kernel:16} {str(entry['shape']):19} {entry['dtype']:8} causal={causal!s:5} "
                    f"do_bench {median_ms:.4f} ms (host {host_ms:.4f} ms a call)")
            for timing in ("event", "queued"):
                row = attnreplay_headline(args.attnreplay, shape, kernel, timing)
                figure = entry[timing] = {"status": row["status"]}
                if "timing" in row and row["timing"].get("median_s"):
                    figure["timed"] = row.get("timed")
                    figure["median_s"] = row["timing"]["median_s"]
                    if "timing_kernel_alone" in row:
                        figure["kernel_alone_s"] = row["timing_kernel_alone"]["median_s"]
                    figure["ratio"] = figure["median_s"] / entry["do_bench_median_s"]
                    figure["within_tolerance"] = abs(figure["ratio"] - 1) <= args.tolerance
                else:
                    figure["reason"] = row.get("reason", "")
                    figure["within_tolerance"] = False
                line += (f"  {timing} {figure.get('median_s', float('nan')) * 1e3:.4f} ms "
                         f"({figure.get('timed', '-')}) {figure.get('ratio', float('nan')):.3f}")
            entry["within_tolerance"] = entry["event"]["within_tolerance"]
            rows.append(entry)
            print(line, flush=True)
        results["adapters"][kernel] = {"rows": rows}
    measured = [row for a in results["adapters"].values() for row in a.get("rows", [])]
    results["passed"] = bool(measured) and all(row["within_tolerance"] for row in measured)
    json.dump(results, open(args.out, "w"), indent=2)
    print("passed" if results["passed"] else "NOT within tolerance (or nothing measured)")
    sys.exit(0 if results["passed"] else 1)


if __name__ == "__main__":
    main()
