#!/usr/bin/env bash
# temporary: both builds, then the FP8 heads kernel under ncu at Flux
set -uo pipefail
export PATH=$PATH:/usr/local/cuda/bin
for t in .:build-gpu bench/tmp_base:build-gpu-base; do
  src=${t%%:*}; b=${t##*:}
  (cmake -S $src -B $b -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$(command -v python3)" -DCMAKE_CUDA_ARCHITECTURES=90a >/dev/null && cmake --build $b -j 8 --target attnreplay 2>&1 | tail -2) &
done
wait
M=l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,gpu__time_duration.sum,smsp__inst_executed.sum
ncu --query-metrics 2>/dev/null | grep -i ldgsts | head -20 > $OUT/ldgsts-metrics.txt
for b in build-gpu build-gpu-base; do
  ncu --clock-control none --print-details all --section MemoryWorkloadAnalysis_Tables --section WarpStateStats \
    --metrics $M -k regex:quantize_fp8 -s 1 -c 1 $b/replay/attnreplay run --shape 1,24,4608,128 --dtype bf16 \
    --kernels fa3-fp8 --min-samples 3 --min-time 0 --timeout 1 --no-ceilings --ref-sample-rows 16 > $OUT/ncu-$b.txt 2>&1
done
