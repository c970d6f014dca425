#!/usr/bin/env bash
# The compiler's resource report for attnreplay's own attention kernels: registers, spills and
# shared memory per instantiation (kind, head dim, element type, P·V accumulation, Sage K scale
# granularity), for sm_90a.
# The registers are those a thread starts with (the launch bounds' share). Where a CTA has a producer
# warpgroup, it then gives registers back and the consumers take them (setmaxnreg: 240 each with
# two consumers, flash at head dim 128; 160 with three); sage2's solo CTAs keep theirs (168 at head
# dim 128, 255 under fp32+fp16 there, 128 at 64). Spills are counted over the whole kernel.
# Needs only nvcc, so it runs on the CPU machine as well: bash bench/kernel_resources.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
for kind in flash sage1_int8 sage2_int8_fp8 fa3_fp8; do
  "$NVCC" -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I"$ROOT" -Xptxas -v -cubin \
    -o "$TMP/$kind.cubin" "$ROOT/kernels/cuda/$kind.cu" 2>&1 |
    python3 -c '
import re, sys
kinds = ["flash", "sage1-int8", "sage2-int8-fp8", "fa3-fp8"]
accumulations = ["fp32", "fp32+fp32", "fp32+fp16"]
name = None
for line in sys.stdin:
    m = re.search(r"AttentionTileILNS_13QuantizedKindE(\d)ELi(\d+)E(?:6__half|13__nv_bfloat16)LNS_7PvAccumE(\d)ELb(\d)EEELb(\d)", line)
    if "Compiling entry function" in line and m:
        element = "bf16" if "bfloat16" in line else "fp16"
        k_scales = "K per_thread" if m.group(4) == "1" else ""
        launch = "several calls" if m.group(5) == "1" else ""
        name = f"{kinds[int(m.group(1))]:15} d{m.group(2):4} {element} {accumulations[int(m.group(3))]:9} {k_scales:12} {launch:13}"
    m = re.search(r"(\d+) bytes spill stores", line)
    if m and name:
        spills = m.group(1)
    m = re.search(r"Used (\d+) registers.*?(\d+) bytes smem", line)
    if m and name:
        print(f"{name} {m.group(1)} registers, {spills} bytes spilled, {m.group(2)} bytes static shared memory")
        name = None
'
done
