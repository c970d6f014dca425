#!/usr/bin/env bash
# Each input-preparation kernel of the quantized kinds under Nsight Compute (clocks left alone):
# duration, DRAM bytes and resident warps, per kernel, on the Flux and 4x32x4096x128 shapes (or
# PREP_NCU_KINDS and PREP_NCU_SHAPES; the environment reaches attnreplay).
# Where bench/preparation_check.py gives the whole preparation, this says which kernel the time
# is in. Needs the GPU build (bench/gpu.sh); GPU_STEPS="prepkernels" there runs it.
# PREP_NCU_SECTIONS (e.g. "LaunchStats Occupancy WarpStateStats") prints those Nsight Compute
# sections for the first timed preparation's kernels instead: why a kernel takes its time (waves
# per SM, resident clusters, stall reasons).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:-$ROOT/build-gpu/replay/attnreplay}"
NCU="$(command -v ncu || true)"
[ -n "$NCU" ] || { echo "ncu is not on the PATH"; exit 1; }
KERNELS="regex:quantize|abs_max|channel_mean|copy_to"
for kind in ${PREP_NCU_KINDS:-sage1-int8 sage2-int8-fp8 fa3-fp8}; do
  for shape in ${PREP_NCU_SHAPES:-1,24,4608,128 4,32,4096,128}; do
    run=("$BIN" run --shape "$shape" --dtype bf16 --kernels "$kind" --min-samples 3 --min-time 0 --timeout 1
         --no-ceilings --ref-sample-rows 16)
    if [ -n "${PREP_NCU_SECTIONS:-}" ]; then
      echo "== $kind $shape (sections of the first timed preparation: the launches after construction's)"
      sections=()
      for section in $PREP_NCU_SECTIONS; do sections+=(--section "$section"); done
      # Construction runs the preparation once: its kernels are those before the first one's
      # name comes again.
      per_call="$("$NCU" --clock-control none --csv --metrics gpu__time_duration.sum -k "$KERNELS" -c 20 "${run[@]}" \
        2>/dev/null | python3 -c '
import csv, sys
names = [r["Kernel Name"] for r in csv.DictReader(l for l in sys.stdin if l.startswith("\""))]
print(names.index(names[0], 1) if names.count(names[0]) > 1 else len(names))
')"
      "$NCU" --clock-control none --apply-rules no "${sections[@]}" -k "$KERNELS" -s "$per_call" -c "$per_call" \
        "${run[@]}" 2>/dev/null | grep -vE "^==PROF==|^\s*$|^\s*-+\s*$"
      continue
    fi
    echo "== $kind $shape (the preparation at construction, then the first timed one)"
    "$NCU" --clock-control none --csv \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
      -k "$KERNELS" -c 12 "${run[@]}" 2>/dev/null | python3 -c '
import csv, sys
rows = csv.DictReader(line for line in sys.stdin if line.startswith("\""))
kernels = {}
for r in rows:
    name = r["Kernel Name"].split("<unnamed>::")[-1].split("(")[0]
    kernels.setdefault((int(r["ID"]), name), {})[r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
for (i, name), m in sorted(kernels.items()):
    us = m["gpu__time_duration.sum"] / 1e3
    read, written = m["dram__bytes_read.sum"] / 1e6, m["dram__bytes_write.sum"] / 1e6
    warps = m["sm__warps_active.avg.pct_of_peak_sustained_active"]
    print(f"{i:3} {name:44} {us:8.1f} us  read {read:7.1f} MB  written {written:6.1f} MB  "
          f"{read / us:5.2f} TB/s read  warps {warps:5.1f} %")
'
  done
done
