// The CPU emulation of the `sage1-int8` kernel, step by step as docs/quantized.md defines it.
#include "kernels/emulated_kernel.h"

namespace attnreplay {
namespace {

class Sage1Int8Cpu final : public EmulatedAttentionKernel {
 public:
  Sage1Int8Cpu()
      : EmulatedAttentionKernel(QuantizedKind::sage1_int8,
                                {"sage1-int8-cpu",
                                 "sage1-int8 (K smoothed, INT8 Q·Kᵀ by --quant_gran) emulated on the CPU (docs/quantized.md)",
                                 "cpu", false, DType::int8}) {}
};

ATTNREPLAY_REGISTER_KERNEL(Sage1Int8Cpu);

}  // namespace
}  // namespace attnreplay
