#!/usr/bin/env python3
"""Plots of an `attnreplay audit --json` record: where each kernel's error sits over the capture,
and what each kernel trades between speed and accuracy.

    attnreplay audit caps/ --kernels flash-cpu,sage1-int8-cpu --json audit.json
    python scripts/plot_audit.py audit.json --out plots/

Writes, into --out (default: <json stem>_plots/ beside the JSON):
  error_by_call.png    rel_l2 of every call, by call position, one series per kernel
  error_by_layer.png   the same against the call's layer (when the capture recorded layers)
  error_by_step.png    the same against the call's step (when the capture recorded steps)
  speed_accuracy_<n>.png  one per captured (shape, dtype, causal): median rel_l2 against median time
                       and against TFLOP/s, one point per kernel (hollow: the same kernel on random
                       inputs of that shape, their median and range over the seeds, when the audit
                       ran with --random-compare)

Errors are drawn on a log scale; a kernel with no error at all (the reference) has nothing to draw
there and is left out of the error plots. Only the JSON is read: nothing is measured here.
"""

import argparse
import json
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402


def positive(value):
    """value when it can sit on a log axis, else NaN (not drawn)."""
    return value if isinstance(value, (int, float)) and value > 0 and math.isfinite(value) else math.nan


def kernel_names(audit):
    return [k["kernel"] for k in audit["kernels"]]


def errors_by_kernel(audit):
    """{kernel: [(call record, rel_l2), ...]} for every call the kernel ran."""
    out = {name: [] for name in kernel_names(audit)}
    for call in audit["calls"]:
        for k in call["kernels"]:
            if k.get("error") is not None and k["kernel"] in out:
                out[k["kernel"]].append((call, k["error"]["rel_l2"]))
    return out


def drawable(points):
    return any(positive(e) == positive(e) for _, e in points)  # any non-NaN


def plot_against(audit, key, label, path):
    """rel_l2 against call[key] (position, layer or step): a dot per call, the median per x."""
    fig, ax = plt.subplots(figsize=(9, 5))
    drawn = False
    for name, points in errors_by_kernel(audit).items():
        xy = [(c[key], positive(e)) for c, e in points if isinstance(c.get(key), (int, float))]
        if not xy or not drawable([(None, y) for _, y in xy]):
            continue
        xs, ys = zip(*xy)
        dots = ax.scatter(xs, ys, s=12, alpha=0.6, label=name)
        by_x = {}
        for x, y in xy:
            if y == y:
                by_x.setdefault(x, []).append(y)
        if key != "position" and by_x:
            keys = sorted(by_x)
            medians = [sorted(by_x[x])[len(by_x[x]) // 2] for x in keys]
            ax.plot(keys, medians, color=dots.get_facecolor()[0], alpha=0.9)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_yscale("log")
    ax.set_xlabel(label)
    ax.set_ylabel("relative L2 error against the fp64 reference")
    ax.set_title(f"error per call against {label}" + ("" if key == "position" else " (line: median)"))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def shape_title(group):
    s = group["shape"]
    causal = ", causal" if group["is_causal"] else ""
    return (f"b{s['batch']} hq{s['heads_q']} hkv{s['heads_kv']} sq{s['seq_q']} skv{s['seq_kv']} "
            f"d{s['head_dim_qk']} {group['dtype']}{causal}: {len(group['calls'])} calls")


def plot_speed_accuracy(group, path):
    """Two panels, x = median time and x = median TFLOP/s; y = median rel_l2; a point per kernel."""
    fig, (by_time, by_rate) = plt.subplots(1, 2, figsize=(12, 5), sharey=True)
    drawn = False
    times_ms = []
    for summary in group["kernels"]:
        y = positive(summary["median_rel_l2"])
        time_s, tflops = summary.get("median_time_s"), summary.get("median_tflops")
        if y != y or time_s is None:
            continue
        times_ms.append(time_s * 1e3)
        for ax, x in ((by_time, time_s * 1e3), (by_rate, tflops)):
            if x is None:
                continue
            point = ax.scatter([x], [y], s=40, label=summary["kernel"])
            ax.annotate(summary["kernel"], (x, y), textcoords="offset points", xytext=(5, 4), fontsize="small")
            random = summary.get("random")
            if random and positive(random.get("rel_l2")) == positive(random.get("rel_l2")):
                color = point.get_facecolor()[0]
                ax.scatter([x], [random["rel_l2"]], s=40, facecolors="none", edgecolors=color)
                # The random calls' range (one call per seed), when they spread.
                low, high = positive(random.get("rel_l2_min", 0.0)), positive(random.get("rel_l2_max", 0.0))
                if low == low and high == high and high > low:
                    ax.vlines([x], low, high, colors=[color], linewidth=1)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    # A log axis only where the kernels' times differ by more than a decade or so.
    if max(times_ms) > 20 * min(times_ms):
        by_time.set_xscale("log")
    by_time.set_xlabel("median time per call (ms)")
    by_rate.set_xlabel("median TFLOP/s")
    by_time.set_ylabel("median relative L2 error")
    for ax in (by_time, by_rate):
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(shape_title(group) + "  (hollow: random inputs)", fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("audit_json", help="the file `attnreplay audit --json` wrote")
    parser.add_argument("--out", help="folder for the PNG files (default: <json stem>_plots/)")
    args = parser.parse_args(argv)
    path = Path(args.audit_json)
    audit = json.loads(path.read_text())
    if audit.get("schema") != "attnreplay.audit":
        sys.exit(f"{path}: expected an attnreplay.audit record, got schema {audit.get('schema')!r}")
    out = Path(args.out) if args.out else path.with_name(path.stem + "_plots")
    out.mkdir(parents=True, exist_ok=True)
    written = [
        plot_against(audit, "position", "call position in the audit", out / "error_by_call.png"),
        plot_against(audit, "layer", "layer", out / "error_by_layer.png"),
        plot_against(audit, "step", "step", out / "error_by_step.png"),
    ]
    for number, group in enumerate(audit["shapes"]):
        written.append(plot_speed_accuracy(group, out / f"speed_accuracy_{number}.png"))
    for file in written:
        if file is not None:
            print(file)


if __name__ == "__main__":
    main()
