#!/usr/bin/env python3
"""The quantized kinds' preparation as a fixed part plus a streaming rate, against a plain copy.

Runs `attnreplay run` as bench/preparation_check.py does (its run_case) on shapes that grow in one
dimension (by default Flux's heads of 4608 keys, 24 to 192 of them), takes each kind's preparation
alone (its median, its bytes), times a device-to-device copy of the same bytes beside it (that
script's copy_floor_s), and fits
time = fixed + bytes / rate over the shapes, for each kind and for the copy. Where a preparation
misses its bound on short calls, this says whether the time goes on a fixed cost a launch pays
(start, the last wave, a head's CTAs waiting for each other) or on the rate at which it streams.
Flags for attnreplay go in --extra, with "=" (argparse takes no value that starts with "-"):
--extra=--no_k_smooth runs the Sage kinds without their heads' means. Used by bench/gpu.sh's
`scaling` step.
"""
import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

from preparation_check import CLUSTER_KEYS, KINDS, copy_floor_s, run_case, shape_elements

# From 24 heads up: at 12, sage1's and sage2's K takes two passes where it is held by groups from 24
# on (int8_key_group in kernels/cuda/quantize.cu), and a fit over both paths means nothing.
SHAPES = ["1,24,4608,128", "1,48,4608,128", "1,96,4608,128", "1,192,4608,128"]


def fit(points):
    """Least squares of seconds against bytes: (fixed seconds, bytes a second)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    return mean_y - slope * mean_x, 1.0 / slope


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attnreplay", required=True)
    parser.add_argument("--shapes", default=" ".join(SHAPES), help="space-separated b,h,s,d (two or more)")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--extra", default="", help="flags for every attnreplay run, given with =: --extra=--no_k_smooth")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    shapes, kinds, extra = args.shapes.split(), args.kinds.split(","), shlex.split(args.extra)
    if len(shapes) < 2:
        parser.error("--shapes: two or more, to fit a line")

    rows, layout = [], {}
    print(f"{'shape':16} {'kind':15} {'MB':>7} {'prep us':>8} {'bound us':>9} {'copy us':>8} {'/bound':>7} "
          f"{'prep-copy us':>12} {'MHz':>5}  {args.extra}")
    for shape in shapes:
        try:
            found = run_case(args.attnreplay, ["--shape", shape, "--dtype", "bf16", "--min-time", "0.3", *extra], kinds,
                             {}, timeout=300)
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            print(f"preparation_scaling.py: {error}", file=sys.stderr)
            return 1
        for kind in kinds:
            r = found[kind]
            if r["preparation_s"] is None:
                print(f"preparation_scaling.py: {shape} {kind}: no preparation timed ({r['status']})", file=sys.stderr)
                return 1
            layout = {key: r[key] for key in CLUSTER_KEYS}
            nbytes, prep_s, bound_s, mhz = r["bytes"], r["preparation_s"], r["bound_s"], r["preparation_mhz"]
            copy_s = copy_floor_s(int(nbytes) // 3)  # moves 3 bytes an element: the same bytes
            rows.append({"shape": shape, "kind": kind, "bytes": nbytes, "preparation_s": prep_s, "bound_s": bound_s,
                         "copy_s": copy_s, "preparation_mhz": mhz})
            print(f"{shape:16} {kind:15} {nbytes / 1e6:7.1f} {prep_s * 1e6:8.1f} {bound_s * 1e6:9.1f} "
                  f"{copy_s * 1e6:8.1f} {prep_s / bound_s:7.2f} {(prep_s - copy_s) * 1e6:12.1f} {mhz or 0:5.0f}",
                  flush=True)
    fits, status = {}, 0
    for kind in kinds:
        mine = [r for r in rows if r["kind"] == kind]
        # One path moves the same bytes an element on every shape; K read once or twice differ by
        # 2 bytes an element, scales and means by well under 0.1.
        per_element = sorted({round(r["bytes"] / shape_elements(["--shape", r["shape"]]), 1) for r in mine})
        if len(per_element) > 1:
            print(f"preparation_scaling.py: {kind}: the shapes take different paths ("
                  f"{' and '.join(map(str, per_element))} bytes an element): no fit; take shapes of one path",
                  file=sys.stderr)
            status = 1
            continue
        fits[kind] = fit([(r["bytes"], r["preparation_s"]) for r in mine])
        fits[f"copy for {kind}"] = fit([(r["bytes"], r["copy_s"]) for r in mine])
    for name, (fixed_s, rate) in fits.items():
        print(f"{name:24} fixed {fixed_s * 1e6:6.1f} us, streams at {rate / 1e12:5.2f} TB/s")
    print("GPU clusters of 8 / 16 CTAs at once, one an SM: " + " / ".join(str(layout.get(k)) for k in CLUSTER_KEYS))
    Path(args.out).write_text(json.dumps({
        "extra": args.extra, "rows": rows,
        "fits": {name: {"fixed_s": f, "bytes_per_s": r} for name, (f, r) in fits.items()},
        **layout}, indent=1))
    return status


if __name__ == "__main__":
    sys.exit(main())
