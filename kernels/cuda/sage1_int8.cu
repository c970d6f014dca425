// `sage1-int8` (SageAttention v1 kind): INT8 Q·Kᵀ (exact int32 sums) with a scale per block, warp
// or thread group, K smoothed; P·V as flash (docs/quantized.md).
#include "kernels/cuda/attention_kernel.cuh"

namespace attnreplay::cuda_attention {

void launch_sage1_int8(const AttentionArgs& args, Order order, cudaStream_t stream) {
  dispatch_attention<QuantizedKind::sage1_int8, PvAccum::fp32_fp32>(args, order, stream);
}

}  // namespace attnreplay::cuda_attention
