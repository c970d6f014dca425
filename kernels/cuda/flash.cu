// `flash`: Q·Kᵀ and P·V in the input dtype (bf16/fp16) on tensor cores with fp32 accumulation, P
// rounded to the input dtype; the un-quantized baseline of docs/quantized.md.
#include "kernels/cuda/attention_kernel.cuh"

namespace attnreplay::cuda_attention {

void flash_attention(const KernelJob& job) { dispatch_attention<QuantizedKind::flash, PvAccum::fp32_fp32>(job); }

}  // namespace attnreplay::cuda_attention
