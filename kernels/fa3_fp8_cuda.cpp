// The `fa3-fp8` CUDA kernel (kernels/cuda/fa3_fp8.cu), as docs/quantized.md defines it.
#include "kernels/cuda_attention_kernel.h"

namespace attnreplay {
namespace {

class Fa3Fp8Cuda final : public CudaAttentionKernel {
 public:
  Fa3Fp8Cuda()
      : CudaAttentionKernel(QuantizedKind::fa3_fp8,
                            {"fa3-fp8",
                             "FlashAttention-3 FP8 kind on the GPU: e4m3 Q, K, V (--fp8_scale per_tensor or per_head) and P, fp32 accumulation (docs/quantized.md)",
                             "cuda", false, DType::float8_e4m3fn}) {}
};

ATTNREPLAY_REGISTER_KERNEL(Fa3Fp8Cuda);

}  // namespace
}  // namespace attnreplay
