// `sage2-int8-fp8` (SageAttention v2 kind): INT8 Q·Kᵀ as sage1; FP8 e4m3 P·V with V scaled per
// channel and P by 448, accumulated as --pv_accum_dtype says (docs/quantized.md).
#include "kernels/cuda/attention_kernel.cuh"

namespace attnreplay::cuda_attention {

void sage2_int8_fp8_attention(const KernelJob& job) {
  switch (job.args->pv_accumulation) {
    case PvAccum::fp32: return dispatch_attention<QuantizedKind::sage2_int8_fp8, PvAccum::fp32>(job);
    case PvAccum::fp32_fp32: return dispatch_attention<QuantizedKind::sage2_int8_fp8, PvAccum::fp32_fp32>(job);
    case PvAccum::fp32_fp16: return dispatch_attention<QuantizedKind::sage2_int8_fp8, PvAccum::fp32_fp16>(job);
  }
  throw std::invalid_argument("sage2-int8-fp8: unknown P·V accumulation");
}

}  // namespace attnreplay::cuda_attention
