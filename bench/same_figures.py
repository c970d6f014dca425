#!/usr/bin/env python3
"""Whether a change that should not move any figure left the timings as they were.

Runs one test list through two attnreplay builds (the change, and a base built from the commit
before it, as bench/same_outputs.py does), in turns: base, change, base, change, ... so that both
see the same machine and clocks. For each (case, kernel) it prints each build's fastest median over
its runs (a run that met a slower clock or a power cap reads slower, never faster), their ratio,
and the noise: how far either build's own runs lie apart. Exit status 1 when a ratio is further
from 1 than --tolerance and than that noise.

  python3 bench/same_figures.py --attnreplay build/replay/attnreplay --base /tmp/build-base/replay/attnreplay \\
      --testlist bench/suite_quant.txt --cases quant-flux-4096+512,quant-sage-16k --rounds 2
"""
import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from attnreplay_record import run_for_record


def testlist_lines(path, tags):
    """The test list's lines whose --case_tag is among `tags` (all when there are none)."""
    lines = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        tag = re.search(r"--case_tag (\S+)", line)
        if tags and not (tag and tag.group(1) in tags):
            continue
        lines.append(line)
    return lines


def medians(binary, testlist, json_path, flags):
    record, _ = run_for_record(binary, ["run", "--testlist", testlist, "-q", "--no-ceilings", *flags], json_path,
                               capture_output=False, stdout=subprocess.DEVNULL)
    out = {}
    for call in record["calls"]:
        for kernel in call["kernels"]:
            timing = kernel.get("timing") or {}
            if timing.get("median_s"):
                out[(call["case_tag"], kernel["kernel"])] = timing["median_s"]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attnreplay", required=True, help="the change's binary")
    parser.add_argument("--base", required=True, help="the base's binary")
    parser.add_argument("--testlist", required=True)
    parser.add_argument("--cases", default="", help="the lines' --case_tag values to run, comma-separated (default: all)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each build, in turns")
    parser.add_argument("--tolerance", type=float, default=0.02, help="ratio off 1 beyond noise that fails")
    parser.add_argument("--flags", default="", help="flags of the change's runs (one binary, two rules: "
                        "--base-flags '--stopping stdrel')")
    parser.add_argument("--base-flags", default="", help="flags of the base's runs")
    parser.add_argument("--out", help="JSON with every median")
    args = parser.parse_args()

    cases = [c for c in args.cases.split(",") if c]
    work = Path(tempfile.mkdtemp(prefix="same-figures-"))
    testlist = work / "testlist.txt"
    testlist.write_text("\n".join(testlist_lines(args.testlist, cases)) + "\n")
    runs = {"base": [], "change": []}
    for round_ in range(args.rounds):
        for name, binary, flags in (("base", args.base, args.base_flags), ("change", args.attnreplay, args.flags)):
            runs[name].append(medians(binary, testlist, work / f"{name}{round_}.json", flags.split()))

    failed = False
    rows = []
    print(f"{'case':<26} {'kernel':<16} {'base ms':>9} {'change ms':>10} {'ratio':>7} {'noise':>7}")
    for key in sorted(runs["base"][0]):
        base = [r[key] for r in runs["base"] if key in r]
        change = [r[key] for r in runs["change"] if key in r]
        if not base or not change:
            continue
        b, c = min(base), min(change)
        ratio = c / b
        noise = max((max(base) - b) / b, (max(change) - c) / c)
        off = abs(ratio - 1) > max(args.tolerance, noise)
        failed = failed or off
        rows.append({"case": key[0], "kernel": key[1], "base_s": base, "change_s": change, "ratio": ratio,
                     "noise": noise})
        print(f"{key[0]:<26} {key[1]:<16} {b * 1e3:>9.4g} {c * 1e3:>10.4g} {ratio:>7.3f} {noise * 100:>6.1f}%"
              + ("  <- beyond noise" if off else ""))
    ratios = [r["ratio"] for r in rows]
    if ratios:
        geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"{len(rows)} timings: geometric mean ratio {geomean:.4f}, range {min(ratios):.3f}-{max(ratios):.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
