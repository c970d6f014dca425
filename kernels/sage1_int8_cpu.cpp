// The CPU emulation of the `sage1-int8` kernel, step by step as docs/quantized.md defines it.
#include "kernels/emulated_kernel.h"

namespace attnreplay {
namespace {

class Sage1Int8Cpu final : public EmulatedAttentionKernel {
 public:
  Sage1Int8Cpu()
      : EmulatedAttentionKernel(QuantizedKind::sage1_int8,
                                {"sage1-int8-cpu",
                                 "SageAttention-1 kind emulated on the CPU: K smoothed, INT8 Q·Kᵀ (--quant_gran), P·V as flash (docs/quantized.md)",
                                 "cpu", false, DType::int8}) {}
};

ATTNREPLAY_REGISTER_KERNEL(Sage1Int8Cpu);

}  // namespace
}  // namespace attnreplay
