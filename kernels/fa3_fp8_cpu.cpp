// The CPU emulation of the `fa3-fp8` kernel, step by step as docs/quantized.md defines it.
#include "kernels/emulated_kernel.h"

namespace attnreplay {
namespace {

class Fa3Fp8Cpu final : public EmulatedAttentionKernel {
 public:
  Fa3Fp8Cpu()
      : EmulatedAttentionKernel(QuantizedKind::fa3_fp8,
                                {"fa3-fp8-cpu",
                                 "FlashAttention-3 FP8 kind emulated on the CPU: e4m3 Q, K, V (--fp8_scale) and P (docs/quantized.md)",
                                 "cpu", false, DType::float8_e4m3fn}) {}
};

ATTNREPLAY_REGISTER_KERNEL(Fa3Fp8Cpu);

}  // namespace
}  // namespace attnreplay
