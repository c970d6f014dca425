#!/usr/bin/env bash
# Everything that needs the GPU, in one call of the device tool: build there, run the GPU tests,
# the timing-fidelity check against triton's do_bench, the suite of the peers' shapes, and
# capture's overhead; results under $OUT (at most 8 files come back).
#   run(command="bash bench/gpu.sh", carry=[".whl"])
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/out/gpu}"
BUILD="$ROOT/build-gpu"
mkdir -p "$OUT"
LOG="$OUT/gpu.log"
exec > >(tee -a "$LOG") 2>&1
status=0
step() { echo; echo "== $* ($(date -u +%H:%M:%S))"; }
# GPU_STEPS picks a subset, e.g. GPU_STEPS="tests dobench" (the build always runs); "adapters", "peer",
# "plugins", "groups", "pipeline", "shard", "reference", "batches", "short", "gap", "prep" (ADAPTER_SHAPES picks
# the adapters step's shapes),
# "scaling" and "prepkernels" run only when asked for (PREP_TESTS=0 leaves out prep's GPU tests, PREP_BASE=0 the
# base build's preparation where BASE_TREE is set for `same` alone, PREP_VARIANTS
# and PREP_CASES pick its runs, PREP_KINDS its kinds; PEER_SHAPES picks the peer step's shapes; GPU_TESTS, pytest's
# arguments, picks the GPU tests; SCALING_SHAPES, SCALING_KINDS and SCALING_EXTRA pick the scaling
# step's shapes, kinds and attnreplay flags; "same" compares outputs with BASE_TREE's build, below,
# and "figures" its timings, FIGURE_CASES picking suite_quant.txt's case tags; "rules" compares the
# default stopping rule's medians with nvbench's on suite_gpu.txt; "efficiency" times the replay
# itself, EFFICIENCY_GPUS, EFFICIENCY_CALLS, EFFICIENCY_TRACES, EFFICIENCY_EXTRA and EFFICIENCY_REPEATS
# picking GPU counts, the serving trace's calls, traces, flags and rounds); "fib" turns a bf16 decoder's capture into FlashInfer-Trace and
# replays it with --fib-traces (needs flashinfer_bench's wheel in .whl, and pydantic's with its
# dependencies where the machine lacks them); "e2e" runs a bf16 decoder's generate() as is and with
# each of E2E_KERNELS substituted for its attention, then a Flux-sized transformer with each of
# E2E_FLUX_KERNELS (attnreplay e2e); "steptime" times both jobs' steps as is and substituted, with
# nothing captured (STEP_ROUNDS alternating rounds); "paged" times capture's cost on a paged decode
# loop alone (the "capture" step includes it); "llm" runs attnreplay's own kernels on a padded bf16
# decoder's captured calls beside unpadded ones, padding's cost and substitution (bench/llm_calls.py).
STEPS="${GPU_STEPS:-tests dobench suite quant capture}"
wants() { [[ " $STEPS " == *" $1 "* ]]; }

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
# Why the clock is held down, if it is (a machine whose SMs ran at 700-1400 MHz under load gave
# timings of nothing but discarded samples on 2026-11-27): what the driver says, temperatures too.
nvidia-smi -q -d PERFORMANCE,TEMPERATURE | grep -E "Active|Idle|Slowdown|Thermal|Power Brake|Sync Boost|SW Power|HW|GPU Current Temp" | grep -v "Not Active" | head -12
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
# Pure-Python packages the image lacks (diffusers) travel as wheels in .whl (bench/README.md says how).
if compgen -G "$ROOT/.whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$ROOT"/.whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi

# SageAttention's extension compiles for about two minutes: beside attnreplay's build, not after it.
PEER_SOURCE="$ROOT/.peer/SageAttention"
if wants peer && [ -d "$PEER_SOURCE/csrc" ]; then
  python3 "$ROOT/bench/peer_sageattention.py" --source "$PEER_SOURCE" --build-dir "$BUILD-peer" --build-only \
    > /tmp/peer-build.log 2>&1 &
  PEER_BUILD=$!
fi

# BASE_TREE: the source of the commit a change is measured against (git archive REV | tar -x -C
# bench/tmp_base, which is git-ignored: carried with carry=["bench/tmp_base"]), built beside this
# one for the `same` and `prep` steps, side by side.
BASE_BIN="$BUILD-base/replay/attnreplay"
if [ -n "${BASE_TREE:-}" ]; then
  (cmake -S "$BASE_TREE" -B "$BUILD-base" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$(command -v python3)" \
    -DCMAKE_CUDA_ARCHITECTURES=90a && cmake --build "$BUILD-base" -j "$(nproc)") > /tmp/base-build.log 2>&1 &
  BASE_BUILD=$!
fi
base_built() {
  [ -n "${BASE_TREE:-}" ] || return 1
  if [ -n "${BASE_BUILD:-}" ]; then
    wait "$BASE_BUILD" || { tail -30 /tmp/base-build.log; BASE_TREE=""; return 1; }
    BASE_BUILD=""
  fi
}

step "build"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$(command -v python3)" \
  -DCMAKE_CUDA_ARCHITECTURES=90a > "$OUT/cmake.log" 2>&1 || { tail -40 "$OUT/cmake.log"; exit 1; }
# A failed build shows its errors, not only its last lines.
if ! cmake --build "$BUILD" -j "$(nproc)" > /tmp/gpu-build.log 2>&1; then
  grep -E -B2 -A12 "error|FAILED" /tmp/gpu-build.log | head -80
  exit 1
fi
tail -3 /tmp/gpu-build.log
BIN="$BUILD/replay/attnreplay"
export ATTNREPLAY_BIN="$BIN" ATTNREPLAY_ATTNCAP_LIB="$BUILD/capture/libattncap.so"
"$BIN" kernels

if wants tests; then
step "GPU tests"
# GPU_TESTS is split as a shell would split it, so that -k 'a or b' stays one argument.
eval "pytest_args=(${GPU_TESTS:-\"\$ROOT/tests/gpu\"})"
python3 -m pytest -q -p no:cacheprovider "${pytest_args[@]}" > "$OUT/pytest.txt" 2>&1 || status=1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.txt" | tail -40
fi

if wants dobench; then
step "timing fidelity against triton.testing.do_bench"
python3 "$ROOT/bench/do_bench_check.py" --attnreplay "$BIN" --out "$OUT/do_bench.json" | tail -40 || status=1
fi

if wants adapters; then
step "each library adapter's headline against do_bench of the library's own call (needs its wheel in .whl)"
python3 "$ROOT/bench/adapter_headline_check.py" --attnreplay "$BIN" --out "$OUT/adapters.json" \
  ${ADAPTER_SHAPES:+--shapes "$ADAPTER_SHAPES"} || status=1
fi

if wants short; then
step "short calls against do_bench"
python3 "$ROOT/bench/short_call_check.py" --attnreplay "$BIN" --out "$OUT/short_calls.json" \
  ${SHORT_METHODS:+--methods "$SHORT_METHODS"} | tail -60 || status=1
fi

if wants gap; then
step "where event timing and do_bench part on short calls (bench/event_gap_probe.py)"
python3 "$ROOT/bench/event_gap_probe.py" --attnreplay "$BIN" --out "$OUT/event_gap.json" | tee "$OUT/event_gap.txt" || status=1
fi

if wants prep; then
step "the quantized kernels' input preparation, variant by variant"
if [ "${PREP_TESTS:-1}" = 1 ]; then
  python3 -m pytest -q -p no:cacheprovider --timeout 300 "$ROOT/tests/gpu/test_quantized_gpu.py" > "$OUT/pytest-quant.txt" 2>&1 || status=1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest-quant.txt" | tail -20
fi
python3 "$ROOT/bench/preparation_check.py" --attnreplay "$BIN" --out "$OUT/preparation.json" \
  --variants "${PREP_VARIANTS:-default}" --cases "${PREP_CASES:-}" ${PREP_KINDS:+--kinds "$PREP_KINDS"} | tee "$OUT/preparation.txt" || status=1
if [ "${PREP_BASE:-1}" = 1 ] && base_built; then
  echo "-- the base ($BASE_TREE), in the same call"
  python3 "$ROOT/bench/preparation_check.py" --attnreplay "$BASE_BIN" --out "$OUT/preparation-base.json" \
    --cases "${PREP_CASES:-}" | tee "$OUT/preparation-base.txt" || status=1
fi
fi

if wants scaling; then
step "the preparation as a fixed part and a streaming rate, beside a copy (bench/preparation_scaling.py)"
python3 "$ROOT/bench/preparation_scaling.py" --attnreplay "$BIN" --out "$OUT/scaling.json" \
  ${SCALING_SHAPES:+--shapes "$SCALING_SHAPES"} ${SCALING_KINDS:+--kinds "$SCALING_KINDS"} --extra="${SCALING_EXTRA:-}" \
  | tee "$OUT/scaling.txt" || status=1
fi

if wants same; then
step "outputs bit for bit against the base build (bench/same_outputs.py)"
if base_built; then
  # SAME_ENV: variables for the change's runs only, e.g. a variant of bench/preparation_check.py.
  env ${SAME_ENV:-} python3 "$ROOT/bench/same_outputs.py" --attnreplay "$BIN" --base "$BASE_BIN" | tee "$OUT/same_outputs.txt" || status=1
else
  echo "no base: set BASE_TREE"; status=1
fi
fi

if wants figures; then
step "the same timings as the base build, in turns (bench/same_figures.py)"
if base_built; then
  python3 "$ROOT/bench/same_figures.py" --attnreplay "$BIN" --base "$BASE_BIN" --testlist "$ROOT/bench/suite_quant.txt" \
    --cases "${FIGURE_CASES:-}" --rounds "${FIGURE_ROUNDS:-2}" --out "$OUT/same_figures.json" | tee "$OUT/same_figures.txt" || status=1
else
  echo "no base: set BASE_TREE"; status=1
fi
fi

if wants rules; then
step "the precision rule against nvbench's (--stopping stdrel), one build, in turns (bench/same_figures.py)"
python3 "$ROOT/bench/same_figures.py" --attnreplay "$BIN" --base "$BIN" --base-flags "--stopping stdrel" \
  --testlist "$ROOT/bench/suite_gpu.txt" --cases "${FIGURE_CASES:-}" --rounds "${FIGURE_ROUNDS:-2}" --tolerance 0.01 \
  --out "$OUT/rules.json" | tee "$OUT/rules.txt" || status=1
fi

if wants efficiency; then
step "what a replay costs beside what it measures (bench/replay_efficiency.py)"
python3 "$ROOT/bench/replay_efficiency.py" --attnreplay "$BIN" --out "$OUT/efficiency.json" \
  --gpus "${EFFICIENCY_GPUS:-1}" --calls "${EFFICIENCY_CALLS:-1000}" --traces "${EFFICIENCY_TRACES:-serving,flux}" --extra="${EFFICIENCY_EXTRA:-}" --launcher "${EFFICIENCY_LAUNCHER:-gpus}" \
  --repeats "${EFFICIENCY_REPEATS:-1}" \
  | tee "$OUT/efficiency.txt" || status=1
fi

if wants prepkernels; then
step "the preparation kernels one by one (ncu)"
bash "$ROOT/bench/preparation_kernels.sh" "$BIN" | tee "$OUT/preparation_kernels.txt" || status=1
fi

if wants fib; then
step "FlashInfer-Trace: a bf16 decoder's capture as workloads, replayed with --fib-traces (bench/flashinfer_trace_check.py)"
python3 "$ROOT/bench/flashinfer_trace_check.py" --attnreplay "$BIN" --attncap "$ATTNREPLAY_ATTNCAP_LIB" \
  --fib-wheel "$(ls "$ROOT"/.whl/flashinfer_bench-*.whl | head -1)" \
  --wheels $(ls "$ROOT"/.whl/pydantic*.whl "$ROOT"/.whl/annotated_types*.whl "$ROOT"/.whl/typing_*.whl 2>/dev/null) \
  --out "$OUT/flashinfer_trace.json" || status=1
fi

if wants e2e; then
step "kernel substitution: a bf16 Llama's generate() with each kernel in place of its SDPA (attnreplay e2e)"
mkdir -p /tmp/e2e-json
# Prompts of one length (--no-padding): attnreplay's CUDA kernels take causal calls and no mask.
for kernel in ${E2E_KERNELS:-torch-cudnn sage2-int8-fp8 fa3-fp8 sageattn-triton}; do
  rm -f /tmp/e2e-decoder.pt
  "$BIN" e2e --kernel "$kernel" --outputs /tmp/e2e-decoder.pt --workdir "/tmp/e2e-$kernel" --json "/tmp/e2e-json/decoder-$kernel.json" -- \
    python3 "$ROOT/tests/e2e/jobs/decoder_job.py" --device cuda --dtype bfloat16 --head-dim 128 --new-tokens 32 \
    --no-padding --timed-generates 3 --save /tmp/e2e-decoder.pt >> "$OUT/e2e.txt" 2>&1 || status=1
  for run in original substituted; do
    echo "decoder $kernel $run: $(tail -1 "/tmp/e2e-$kernel/$run/stdout.txt" 2>/dev/null)" >> "$OUT/e2e.txt"
  done
done
# A Flux-sized transformer (two blocks at FLUX.1's widths): the latents' PSNR, and its step time as
# the job itself timed it (each run's stdout), both ways.
for kernel in ${E2E_FLUX_KERNELS:-sage2-int8-fp8 fa3-fp8 sageattn-triton}; do
  rm -f /tmp/e2e-flux.pt
  "$BIN" e2e --kernel "$kernel" --outputs /tmp/e2e-flux.pt --workdir "/tmp/e2e-flux-$kernel" --json "/tmp/e2e-json/flux-$kernel.json" -- \
    python3 "$ROOT/bench/flux_block_job.py" --device cuda --save /tmp/e2e-flux.pt >> "$OUT/e2e.txt" 2>&1 || status=1
  for run in original substituted; do
    echo "flux $kernel $run: $(tail -1 "/tmp/e2e-flux-$kernel/$run/stdout.txt" 2>/dev/null)" >> "$OUT/e2e.txt"
  done
done
cat "$OUT/e2e.txt"
# One file of the records (few files come back from the machine): {"decoder-KERNEL": record, ...}.
python3 -c 'import json, pathlib, sys; print(json.dumps({p.stem: json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json"))}, indent=1))' \
  /tmp/e2e-json > "$OUT/e2e.json" || status=1
fi

if wants steptime; then
step "step times as is and with each kernel substituted, nothing captured (bench/substitution_step_time.py)"
python3 "$ROOT/bench/substitution_step_time.py" --attncap "$ATTNREPLAY_ATTNCAP_LIB" --rounds "${STEP_ROUNDS:-3}" \
  --kernels torch-cudnn ${E2E_FLUX_KERNELS:-sage2-int8-fp8 fa3-fp8 sageattn-triton} --json "$OUT/steps_flux.json" -- \
  python3 "$ROOT/bench/flux_block_job.py" --device cuda --steps 10 --save /tmp/steps-flux.pt | tee "$OUT/steps.txt" || status=1
python3 "$ROOT/bench/substitution_step_time.py" --attncap "$ATTNREPLAY_ATTNCAP_LIB" --rounds "${STEP_ROUNDS:-3}" \
  --kernels ${E2E_KERNELS:-torch-cudnn sage2-int8-fp8 fa3-fp8 sageattn-triton} --json "$OUT/steps_decoder.json" -- \
  python3 "$ROOT/tests/e2e/jobs/decoder_job.py" --device cuda --dtype bfloat16 --head-dim 128 --new-tokens 32 \
  --no-padding --timed-generates 5 | tee -a "$OUT/steps.txt" || status=1
fi

if wants llm; then
step "attnreplay's own kernels on an LLM's calls: padded beside unpadded, padding's cost, substitution (bench/llm_calls.py)"
python3 "$ROOT/bench/llm_calls.py" --attnreplay "$BIN" --attncap "$ATTNREPLAY_ATTNCAP_LIB" --out "$OUT/llm.json" \
  | tee "$OUT/llm.txt" || status=1
fi

if wants batches; then
step "batches (FlashInfer's routines)"
"$BIN" run --testlist "$ROOT/bench/suite_batches.txt" --json "$OUT/batches.json" --csv "$OUT/batches.csv" \
  > "$OUT/batches.txt" 2>&1 || status=1
cat "$OUT/batches.txt" | grep -v "^  kernel" | head -60
fi

if wants suite; then
step "suite"
"$BIN" run --testlist "$ROOT/bench/suite_gpu.txt" --json "$OUT/suite.json" --csv "$OUT/suite.csv" \
  > "$OUT/suite.txt" 2>&1 || status=1
grep -E "^\[|torch-|summary|calls," "$OUT/suite.txt" | head -80
python3 "$ROOT/bench/plot_suite.py" "$OUT/suite.json" "$OUT/suite.png" || status=1
fi

if wants quant; then
step "attnreplay's own CUDA kernels beside torch's (suite_quant.txt)"
"$BIN" run --testlist "$ROOT/bench/suite_quant.txt" --json "$OUT/quant.json" --csv "$OUT/quant.csv" \
  > "$OUT/quant.txt" 2>&1 || status=1
grep -E "^\[|torch-|flash|sage|fa3|calls," "$OUT/quant.txt" | head -80
# Which tensor-core instructions the kernels compiled to (mma.sync: HMMA/IMMA/QMMA; wgmma: *GMMA).
for lib in "$BUILD"/kernels/libattnreplay_cuda_attention.a; do
  cuobjdump -sass "$lib" 2>/dev/null | grep -oE "\b(HMMA|IMMA|QMMA|HGMMA|IGMMA|QGMMA)[.A-Z0-9]*" | sort | uniq -c
done | tee "$OUT/sass.txt"
# And the compiler's resource report: registers and spills per instantiation.
bash "$ROOT/bench/kernel_resources.sh" | tee -a "$OUT/sass.txt" || status=1
fi

if wants peer; then
step "SageAttention2's own sm90 kernel beside ours (bench/peer_sageattention.py)"
if [ -n "${PEER_BUILD:-}" ]; then
  # Only this pid: a bare `wait` would also wait for the tee that the log goes through.
  wait "$PEER_BUILD" || { tail -30 /tmp/peer-build.log; status=1; }
  python3 "$ROOT/bench/peer_sageattention.py" --source "$PEER_SOURCE" --build-dir "$BUILD-peer" \
    --attnreplay "$BIN" --out "$OUT/peer.json" ${PEER_SHAPES:+--shapes "$PEER_SHAPES"} 2>&1 | grep -v "^W[0-9]" \
    | tee "$OUT/peer.txt" || status=1
else
  echo "no SageAttention checkout in .peer/SageAttention (bench/README.md says how to get one)"
fi
fi

if wants plugins; then
step "plug-in kernels: do_bench and Python's error statistics against attnreplay's (bench/plugins_check.py)"
python3 "$ROOT/bench/plugins_check.py" --attnreplay "$BIN" --out "$OUT/plugins.json" \
  --kernel-module "$ROOT/examples/plugins/triton_flash.py" 2>&1 | grep -v "^W[0-9]" | tee "$OUT/plugins.txt" || status=1
step "a diffusers Flux block captured, replayed with --kernels all beside the plug-ins"
cmake --install "$BUILD" --prefix /tmp/attnreplay-installed > /dev/null || status=1
cmake -S "$ROOT/examples/plugins/cuda_kernel" -B /tmp/cuda-example -G Ninja -DCMAKE_PREFIX_PATH=/tmp/attnreplay-installed \
  -DCMAKE_CUDA_ARCHITECTURES=90 > /dev/null && cmake --build /tmp/cuda-example > /dev/null || status=1
rm -rf /tmp/flux-caps
LD_PRELOAD="$ATTNREPLAY_ATTNCAP_LIB" ATTNCAP_OUT=/tmp/flux-caps python3 "$ROOT/bench/jobs/flux_block.py" --steps 1 --warmup 0 \
  || status=1
"$BIN" run /tmp/flux-caps --kernels all --kernel-module "$ROOT/examples/plugins/triton_flash.py" \
  --kernel-library /tmp/cuda-example/libcuda_tiled_attention.so --json "$OUT/flux_all.json" --csv "$OUT/flux_all.csv" \
  > "$OUT/flux_all.txt" 2>&1 || status=1
cat "$OUT/flux_all.txt" | head -60
fi

if wants groups; then
step "time per shape, judge per call: 200 calls in 4 shapes through 5 kernels (bench/timing_groups_check.py)"
python3 "$ROOT/bench/timing_groups_check.py" --attnreplay "$BIN" --out "$OUT/groups.json" | tee "$OUT/groups.txt" || status=1
step "a Python plug-in under each timing method"
for method in event graph cupti; do
  "$BIN" run --shape 1,24,4608,128 --dtype bf16 --kernels triton-flash,torch-cudnn --timing $method --no-ceilings \
    --kernel-module "$ROOT/examples/plugins/triton_flash.py" -q --json /tmp/method-$method.json || status=1
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); [print(sys.argv[2], k['kernel'], k['status'], k.get('timing',{}).get('method'), k.get('timing',{}).get('median_s'), k['reason'][:120]) for k in r['calls'][0]['kernels']]" /tmp/method-$method.json $method
done 2>&1 | tee "$OUT/plugin_timing_methods.txt"
fi

if wants pipeline; then
step "replay throughput end to end against cat (bench/pipeline_check.py)"
python3 "$ROOT/bench/pipeline_check.py" --attnreplay "$BIN" --out "$OUT/pipeline.json" --folder /tmp/pipeline \
  | tee "$OUT/pipeline.txt" || status=1
fi
if wants shard; then
step "torchrun: two processes share a capture on this machine's GPUs, rank 0 joins the parts"
python3 "$ROOT/bench/sharding_check.py" --attnreplay "$BIN" --out "$OUT/sharding.json" | tee "$OUT/sharding.txt" \
  || status=1
fi
if wants reference; then
step "fp64 GPU reference on the whole CogVideoX call"
"$BIN" run --shape 2,30,17776,64 --dtype bf16 --kernels reference-cuda --ref-sample-rows 256 --warmup 1 \
  --min-samples 3 --min-time 0 --json "$OUT/reference.json" 2>&1 | tail -8 || status=1
fi

if wants capture; then
step "capture overhead on the GPU"
python3 "$ROOT/bench/capture_overhead.py" --device cuda --attncap "$ATTNREPLAY_ATTNCAP_LIB" --rounds 3 --steps 30 \
  --out "$OUT/capture_gpu.json" | tail -30 || status=1
fi

if wants paged && ! wants capture; then
step "capture overhead on a paged decode loop"
python3 "$ROOT/bench/capture_overhead.py" --device cuda --attncap "$ATTNREPLAY_ATTNCAP_LIB" --rounds 3 --steps 20 \
  --paged-decode-only --out "$OUT/capture_paged.json" | tail -30 || status=1
fi

step "done: status $status"
exit $status
