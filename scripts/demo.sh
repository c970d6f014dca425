#!/usr/bin/env bash
# The README's demo command: set up (idempotent), capture the bundled real model (MiniLM) with
# LD_PRELOAD, replay its attention calls through every kernel (and a Python plug-in), audit the quantized kernels'
# accuracy on them and what one does to the model's embeddings (attnreplay e2e), write them as FlashInfer-Bench workloads, then a CPU-sized suite of the peers' shapes, and one
# HTML report of the three.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
source "$ROOT/scripts/setup.sh"
OUT="${ATTNREPLAY_DEMO_OUT:-$ROOT/out/demo}"
BIN="$BUILD/replay/attnreplay"
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

echo "== Capturing a real model's attention calls (all-MiniLM-L6-v2 on the CPU), unchanged, under LD_PRELOAD"
rm -rf "$OUT/minilm_capture"
LD_PRELOAD="$BUILD/capture/libattncap.so" ATTNCAP_OUT="$OUT/minilm_capture" \
  "$VENV/bin/python" "$ROOT/examples/run_minilm.py" --repeat 2
"$BIN" info "$OUT/minilm_capture"

echo; echo "== Replaying them through every kernel against the fp64 reference, a Python plug-in kernel among them"
status=0
"$BIN" run "$OUT/minilm_capture" --kernels all --kernel-module "$ROOT/examples/plugins/chunked_sdpa.py" --refcheck \
  --json "$OUT/minilm.json" --csv "$OUT/minilm.csv" || status=$?

echo; echo "== How much accuracy the quantized kernels lose on this model (their CPU emulations, inputs cast to bf16)"
"$BIN" audit "$OUT/minilm_capture" --kernels flash-cpu,sage1-int8-cpu,sage2-int8-fp8-cpu,fa3-fp8-cpu \
  --cast-inputs bf16 --random-compare --attribute --worst 2 --json "$OUT/audit.json" --csv "$OUT/audit.csv" || status=$?

echo; echo "== What one of them does to the model itself: MiniLM in bf16 as is and with sage2-int8-fp8 (CPU emulation) substituted"
rm -rf "$OUT/e2e" "$OUT/embeddings.npy"
"$BIN" e2e --kernel sage2-int8-fp8-cpu --outputs "$OUT/embeddings.npy" --workdir "$OUT/e2e" --json "$OUT/e2e.json" -- \
  "$VENV/bin/python" "$ROOT/examples/run_minilm.py" --repeat 2 --dtype bfloat16 --save "$OUT/embeddings.npy" || status=$?

echo; echo "== The same calls as FlashInfer-Bench workloads (FlashInfer-Trace), which its solutions run on and attnreplay reads back"
rm -rf "$OUT/minilm_flashinfer"
"$BIN" convert "$OUT/minilm_capture" "$OUT/minilm_flashinfer" --to flashinfer-trace || status=$?
(cd "$OUT/minilm_flashinfer" && find definitions workloads -type f | sort | sed 's/^/  /')

echo; echo "== The peers' shapes, scaled to what a CPU replays in about a minute (examples/cpu_suite.txt)"
"$BIN" run --testlist "$ROOT/examples/cpu_suite.txt" --json "$OUT/suite.json" --csv "$OUT/suite.csv" || status=$?

echo; echo "== One HTML page of the three: summary, speed against accuracy, roofline, error by layer and step, tables"
"$BIN" report "$OUT/minilm.json" "$OUT/audit.json" "$OUT/suite.json" -o "$OUT/report.html" || status=$?

echo; echo "Results: $OUT/{minilm,audit,suite}.{json,csv}, $OUT/e2e.json; open $OUT/report.html in a browser"
exit "$status"
