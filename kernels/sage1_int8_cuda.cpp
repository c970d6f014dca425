// The `sage1-int8` CUDA kernel (kernels/cuda/sage1_int8.cu), as docs/quantized.md defines it.
#include "kernels/cuda_attention_kernel.h"

namespace attnreplay {
namespace {

class Sage1Int8Cuda final : public CudaAttentionKernel {
 public:
  Sage1Int8Cuda()
      : CudaAttentionKernel(QuantizedKind::sage1_int8,
                            {"sage1-int8",
                             "SageAttention-1 kind on the GPU: INT8 Q·Kᵀ (--quant_gran groups, K smoothed unless --no_k_smooth), bf16/fp16 P·V (docs/quantized.md)",
                             "cuda", false, DType::int8}) {}
};

ATTNREPLAY_REGISTER_KERNEL(Sage1Int8Cuda);

}  // namespace
}  // namespace attnreplay
