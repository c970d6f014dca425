// The `flash` CUDA kernel (kernels/cuda/flash.cu), as docs/quantized.md defines it.
#include "kernels/cuda_attention_kernel.h"

namespace attnreplay {
namespace {

class FlashCuda final : public CudaAttentionKernel {
 public:
  FlashCuda()
      : CudaAttentionKernel(QuantizedKind::flash,
                            {"flash",
                             "bf16/fp16 tensor-core attention, FlashAttention-2 style, P in the input dtype: the baseline of the quantized kernels (docs/quantized.md)",
                             "cuda"}) {}
};

ATTNREPLAY_REGISTER_KERNEL(FlashCuda);

}  // namespace
}  // namespace attnreplay
