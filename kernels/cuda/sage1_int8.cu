// `sage1-int8` (SageAttention v1 kind): INT8 Q·Kᵀ (exact int32 sums) with a scale per block, warp
// or thread group, K smoothed; P·V as flash (docs/quantized.md).
#include "kernels/cuda/attention_kernel.cuh"

namespace attnreplay::cuda_attention {

void sage1_int8_attention(const KernelJob& job) { dispatch_attention<QuantizedKind::sage1_int8, PvAccum::fp32_fp32>(job); }

}  // namespace attnreplay::cuda_attention
