// The CPU emulation of the `fa3-fp8` kernel, step by step as docs/quantized.md defines it.
#include "kernels/emulated_kernel.h"

namespace attnreplay {
namespace {

class Fa3Fp8Cpu final : public EmulatedAttentionKernel {
 public:
  Fa3Fp8Cpu()
      : EmulatedAttentionKernel(QuantizedKind::fa3_fp8,
                                {"fa3-fp8-cpu",
                                 "fa3-fp8 (e4m3 Q, K, V by --fp8_scale, and P) emulated on the CPU (docs/quantized.md)",
                                 "cpu", false, DType::float8_e4m3fn}) {}
};

ATTNREPLAY_REGISTER_KERNEL(Fa3Fp8Cpu);

}  // namespace
}  // namespace attnreplay
