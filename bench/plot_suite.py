"""TFLOP/s per kernel per shape from an `attnreplay run --json` report, as a PNG bar chart."""
import argparse
import json
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("report")
    parser.add_argument("png")
    args = parser.parse_args()
    report = json.load(open(args.report))
    rates = defaultdict(dict)
    cases = []
    for call in report["calls"]:
        case = call["case_tag"] or f"call {call['call_index']}"
        cases.append(case)
        for kernel in call["kernels"]:
            if kernel.get("tflops"):
                rates[kernel["kernel"]][case] = kernel["tflops"]
    kernels = sorted(rates)
    width = 0.8 / max(1, len(kernels))
    fig, ax = plt.subplots(figsize=(max(8, len(cases) * 0.9), 5))
    for i, kernel in enumerate(kernels):
        xs = [c + i * width for c in range(len(cases))]
        ax.bar(xs, [rates[kernel].get(case, 0) for case in cases], width, label=kernel)
    ax.set_xticks([c + width * (len(kernels) - 1) / 2 for c in range(len(cases))])
    ax.set_xticklabels(cases, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("TFLOP/s (median, cold L2)")
    env = report["environment"]
    ax.set_title(f"attnreplay on {env.get('gpu', '?')}: bf16 ceiling {env.get('ceiling_bf16_tflops', '?')} TFLOP/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.png, dpi=120)


if __name__ == "__main__":
    main()
