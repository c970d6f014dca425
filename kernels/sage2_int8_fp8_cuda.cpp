// The `sage2-int8-fp8` CUDA kernel (kernels/cuda/sage2_int8_fp8.cu), as docs/quantized.md defines it.
#include "kernels/cuda_attention_kernel.h"

namespace attnreplay {
namespace {

class Sage2Int8Fp8Cuda final : public CudaAttentionKernel {
 public:
  Sage2Int8Fp8Cuda()
      : CudaAttentionKernel(QuantizedKind::sage2_int8_fp8,
                            {"sage2-int8-fp8",
                             "SageAttention-2 kind on the GPU: INT8 Q·Kᵀ as sage1, FP8 P·V with per-channel V (--pv_accum_dtype) (docs/quantized.md)",
                             "cuda", false, DType::float8_e4m3fn}) {}
};

ATTNREPLAY_REGISTER_KERNEL(Sage2Int8Fp8Cuda);

}  // namespace
}  // namespace attnreplay
