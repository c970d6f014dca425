// The CPU emulation of the `sage2-int8-fp8` kernel, step by step as docs/quantized.md defines it.
#include "kernels/emulated_kernel.h"

namespace attnreplay {
namespace {

class Sage2Int8Fp8Cpu final : public EmulatedAttentionKernel {
 public:
  Sage2Int8Fp8Cpu()
      : EmulatedAttentionKernel(QuantizedKind::sage2_int8_fp8,
                                {"sage2-int8-fp8-cpu",
                                 "sage2-int8-fp8 (INT8 Q·Kᵀ, FP8 P·V by --pv_accum_dtype) emulated on the CPU (docs/quantized.md)",
                                 "cpu", false, DType::float8_e4m3fn}) {}
};

ATTNREPLAY_REGISTER_KERNEL(Sage2Int8Fp8Cpu);

}  // namespace
}  // namespace attnreplay
