// `fa3-fp8` (FlashAttention-3 FP8 kind): e4m3 Q, K and V with a scale per tensor or per head,
// e4m3 P unscaled, fp32 accumulation (docs/quantized.md).
#include "kernels/cuda/attention_kernel.cuh"

namespace attnreplay::cuda_attention {

void fa3_fp8_attention(const KernelJob& job) { dispatch_attention<QuantizedKind::fa3_fp8, PvAccum::fp32_fp32>(job); }

}  // namespace attnreplay::cuda_attention
