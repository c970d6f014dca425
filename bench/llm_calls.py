"""attnreplay's own kernels on an LLM's calls (issue 72's figures): a Llama-style decoder
(tests/e2e/jobs/decoder_job.py; on the GPU bf16, 8 layers, GQA 32/8, head dim 128) generating for
four left-padded prompts, captured under the preload, and the same job with prompts of one length
(no mask), both replayed through the kernels:

- per kernel, the calls it ran and refused (with the reasons), and rel_l2 over the rows that see a
  key (the record's errors leave rows without keys out), padded beside unpadded: a kernel that
  takes padding as structure errs on padded calls as it does on unmasked ones;
- what padding costs: the padded prefill call's median against its batch entries run alone, each a
  dense causal call of its prompt's tokens (generated, the same shapes), summed;
- `attnreplay e2e --kernel K` on the padded job: the calls substituted and the tokens that agree.

    python3 bench/llm_calls.py --attnreplay build/replay/attnreplay --attncap build/capture/libattncap.so \\
        --out llm.json            # on the GPU (bench/gpu.sh, GPU_STEPS=llm)
    ... --device cpu --small      # the same steps on the CPU's kernels, a small model, in a minute
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from attnreplay_record import kernel_results, median_seconds, run_for_record

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "e2e" / "jobs" / "decoder_job.py"
KERNELS = {"cuda": "flash,sage1-int8,sage2-int8-fp8,fa3-fp8,torch-flash,torch-cudnn,torch-efficient",
           "cpu": "flash-cpu,sage1-int8-cpu,sage2-int8-fp8-cpu,fa3-fp8-cpu,torch-flash-cpu,torch-math"}
OURS = {"cuda": ["flash", "sage1-int8", "sage2-int8-fp8", "fa3-fp8"],
        "cpu": ["flash-cpu", "sage1-int8-cpu", "sage2-int8-fp8-cpu", "fa3-fp8-cpu"]}


def job_arguments(args, padded):
    sizes = ["--layers", "2", "--heads", "4", "--kv-heads", "2", "--head-dim", "64", "--batch", "4", "--prompt", "48",
             "--pad-step", "8", "--new-tokens", "3"] if args.small else \
            ["--layers", "8", "--heads", "32", "--kv-heads", "8", "--head-dim", "128", "--batch", "4",
             "--prompt", str(args.prompt), "--pad-step", str(args.pad_step), "--new-tokens", str(args.new_tokens)]
    return [sys.executable, str(JOB), "--device", args.device, "--dtype", "bfloat16", *sizes,
            *([] if padded else ["--no-padding"])]


def capture(args, folder, padded):
    env = dict(os.environ, LD_PRELOAD=args.attncap, ATTNCAP_OUT=str(folder))
    done = subprocess.run(job_arguments(args, padded), env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the decoder job failed under capture:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return folder


def kernel_summary(record, kernels):
    """Per kernel: calls ran and refused (reasons counted), rel_l2 median and largest, split into
    prefill (the first step's calls) and decode calls. (Not by query rows: for a decode step
    transformers folds a GQA group's query heads into rows, (b, heads_kv, n_rep, d).)"""
    summary = {}
    prefill_step = record["calls"][0]["metadata"].get("step") if record["calls"] else None
    for call, result in kernel_results(record):
        name = result["kernel"]
        if name not in kernels:
            continue
        row = summary.setdefault(name, {"ran": 0, "refused": Counter(), "failed": 0, "rel_l2": {"prefill": [], "decode": []}})
        if result["status"] == "not_supported":
            row["refused"][result.get("reason", "")] += 1
        elif result["status"] == "failed":
            row["failed"] += 1
        else:
            row["ran"] += 1
            kind = "prefill" if call["metadata"].get("step") == prefill_step else "decode"
            row["rel_l2"][kind].append(result["error"]["rel_l2"])
    for row in summary.values():
        row["refused"] = dict(row["refused"])
        row["rel_l2"] = {kind: {"median": statistics.median(values), "max": max(values), "calls": len(values)}
                         for kind, values in row["rel_l2"].items() if values}
    return summary


def padding_cost(args, record, work):
    """The padded prefill call (the first with a padding mask and as many rows as keys) against its entries
    alone, unpadded: per kernel the padded median, the entries' medians summed, and their ratio."""
    prefill = next((c for c in record["calls"] if c["shape"]["seq_q"] == c["shape"]["seq_kv"] and
                    "padding" in (c.get("mask_structure") or "")), None)
    if prefill is None:
        return {"note": "no padded prefill call in the capture"}
    shape = prefill["shape"]
    # "causal + left padding, keys from 0/96/192/288": each entry's first key.
    firsts = [int(x) for x in prefill["mask_structure"].split("keys from ")[1].split(" ")[0].split("/")]
    lengths = [shape["seq_kv"] - first for first in firsts]
    entries = {}
    for length in lengths:
        record_alone, _ = run_for_record(args.attnreplay, [
            "run", "--shape", f"1,{shape['heads_q']},{length},{shape['head_dim_qk']}", "--num_kv_heads", str(shape["heads_kv"]),
            "--causal", "--dtype", "bf16", "--kernels", ",".join(OURS[args.device]), "-q", *args.extra],
            Path(work) / f"alone-{length}.json")
        for _, result in kernel_results(record_alone):
            if median_seconds(result) is not None:
                entries.setdefault(result["kernel"], []).append(median_seconds(result))
    cost = {"call_index": prefill["call_index"], "mask_structure": prefill["mask_structure"], "entry_tokens": lengths,
            "kernels": {}}
    for result in prefill["kernels"]:
        padded = median_seconds(result)
        alone = entries.get(result["kernel"])
        if padded is not None and alone and len(alone) == len(lengths):
            cost["kernels"][result["kernel"]] = {"padded_s": padded, "entries_alone_s": sum(alone),
                                                 "ratio": padded / sum(alone)}
    return cost


def substitution(args, kernel, work):
    """`attnreplay e2e --kernel KERNEL` on the padded job: what its record says of the calls and tokens."""
    folder = Path(work) / f"e2e-{kernel}"
    outputs = Path(work) / "e2e-outputs.pt"
    record, done = run_for_record(args.attnreplay, [
        "e2e", "--kernel", kernel, "--outputs", outputs, "--workdir", folder, "--",
        *job_arguments(args, padded=True), "--save", outputs], Path(work) / f"e2e-{kernel}.json")
    return {"exit": done.returncode, "record": record}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attnreplay", required=True)
    parser.add_argument("--attncap", required=True, help="libattncap.so")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--small", action="store_true", help="a small model (2 layers, 4/2 heads of 64, 48 tokens)")
    parser.add_argument("--prompt", type=int, default=1024, help="the longest prompt's tokens")
    parser.add_argument("--pad-step", type=int, default=96, help="prompt i is i x this many tokens shorter")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--kernels", help="the replay's kernels (default: ours and torch's backends on the device)")
    parser.add_argument("--e2e-kernels", help="kernels substituted under attnreplay e2e (default: sage2-int8-fp8)")
    parser.add_argument("--extra", default="", help="more flags for every replay, in one argument: --extra=\"--min-time 0\"")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    args.extra = args.extra.split()
    kernels = args.kernels or KERNELS[args.device]
    e2e_kernels = (args.e2e_kernels or ("sage2-int8-fp8" if args.device == "cuda" else "sage2-int8-fp8-cpu")).split(",")
    result = {"device": args.device, "job": job_arguments(args, padded=True)[2:], "kernels": kernels}
    with tempfile.TemporaryDirectory() as work:
        for name, padded in (("padded", True), ("unpadded", False)):
            folder = capture(args, Path(work) / f"capture-{name}", padded)
            record, _ = run_for_record(args.attnreplay, ["run", folder, "--kernels", kernels, "-q", *args.extra],
                                       Path(work) / f"{name}.json")
            result[name] = {"calls": len(record["calls"]), "kernels": kernel_summary(record, kernels.split(",")),
                            "masks": dict(Counter(c.get("mask_structure") or "none" for c in record["calls"]))}
            if padded:
                result["padding_cost"] = padding_cost(args, record, work)
            print(f"{name}: {len(record['calls'])} calls")
            for kernel, row in result[name]["kernels"].items():
                errors = ", ".join(f"{kind} rel_l2 {e['median']:.3g} (max {e['max']:.3g}, {e['calls']} calls)"
                                   for kind, e in row["rel_l2"].items())
                refused = "; ".join(f"{n} refused: {reason}" for reason, n in row["refused"].items())
                print(f"  {kernel:20} ran {row['ran']:4}  {errors}{'  ' + refused if refused else ''}")
        # A kernel errs on padded calls as on unmasked ones: its largest rel_l2 no more than 1.25x
        # the unpadded calls' largest, prefill and decode apart.
        verdicts = {}
        for kernel in OURS[args.device]:
            padded, unpadded = result["padded"]["kernels"].get(kernel), result["unpadded"]["kernels"].get(kernel)
            if not padded or not unpadded:
                continue
            verdicts[kernel] = {
                "refused_padded": sum(padded["refused"].values()),
                **{f"{kind}_within_unpadded": padded["rel_l2"][kind]["max"] <= 1.25 * unpadded["rel_l2"][kind]["max"]
                   for kind in ("prefill", "decode") if kind in padded["rel_l2"] and kind in unpadded["rel_l2"]}}
        result["verdicts"] = verdicts
        print("padded against unpadded:", json.dumps(verdicts))
        cost = result["padding_cost"]
        for kernel, row in cost.get("kernels", {}).items():
            print(f"padding cost {kernel:20} padded {row['padded_s'] * 1e3:.3f} ms, entries alone "
                  f"{row['entries_alone_s'] * 1e3:.3f} ms: {row['ratio']:.3f}x")
        result["substitution"] = {kernel: substitution(args, kernel, work) for kernel in e2e_kernels}
        for kernel, run in result["substitution"].items():
            substituted = next((r.get("substitution", {}) for r in run["record"]["runs"] if r["run"] == "substituted"), {})
            tensors = {t["tensor"]: t for output in run["record"]["outputs"] for t in output["tensors"]}
            tokens = tensors.get("tokens", {}).get("distance", {})
            logits = tensors.get("logits", {}).get("logits", {})
            print(f"e2e {kernel} (exit {run['exit']}): {substituted.get('substituted')} calls substituted "
                  f"({substituted.get('substituted_where')}), {substituted.get('left')} left {substituted.get('left_by_reason')}; "
                  f"tokens differing {tokens.get('differing')} of {tokens.get('elements')}, "
                  f"logits top-1 agreement {logits.get('top1_agreement')}")
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
