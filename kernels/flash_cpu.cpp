// The CPU emulation of the `flash` kernel, step by step as docs/quantized.md defines it.
#include "kernels/emulated_kernel.h"

namespace attnreplay {
namespace {

class FlashCpu final : public EmulatedAttentionKernel {
 public:
  FlashCpu()
      : EmulatedAttentionKernel(QuantizedKind::flash,
                                {"flash-cpu",
                                 "flash (bf16/fp16 Q·Kᵀ and P·V, fp32 accumulation) emulated on the CPU (docs/quantized.md)",
                                 "cpu"}) {}
};

ATTNREPLAY_REGISTER_KERNEL(FlashCpu);

}  // namespace
}  // namespace attnreplay
