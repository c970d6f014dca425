#include "kernels/quantized_kinds.h"

#include <stdexcept>

namespace attnreplay {

const std::vector<QuantizedKindSpec>& quantized_kinds() {
  static const std::vector<QuantizedKindSpec> kinds = {
      {QuantizedKind::flash, "flash", "bf16/fp16 Q·Kᵀ and P·V, fp32 accumulation",
       "bf16/fp16 tensor-core attention, FlashAttention-2 style, P in the input dtype: the baseline of the "
       "quantized kernels (docs/quantized.md)",
       std::nullopt},
      {QuantizedKind::sage1_int8, "sage1-int8", "K smoothed, INT8 Q·Kᵀ by --quant_gran",
       "SageAttention-1 kind on the GPU: INT8 Q·Kᵀ (--quant_gran groups, K smoothed unless --no_k_smooth), bf16/fp16 "
       "P·V (docs/quantized.md)",
       DType::int8},
      {QuantizedKind::sage2_int8_fp8, "sage2-int8-fp8", "INT8 Q·Kᵀ, FP8 P·V by --pv_accum_dtype",
       "SageAttention-2 kind on the GPU: INT8 Q·Kᵀ as sage1, FP8 P·V with per-channel V (--pv_accum_dtype) "
       "(docs/quantized.md)",
       DType::float8_e4m3fn},
      {QuantizedKind::fa3_fp8, "fa3-fp8", "e4m3 Q, K, V by --fp8_scale, and P",
       "FlashAttention-3 FP8 kind on the GPU: e4m3 Q, K, V (--fp8_scale per_tensor or per_head) and P, fp32 "
       "accumulation (docs/quantized.md)",
       DType::float8_e4m3fn},
  };
  return kinds;
}

const QuantizedKindSpec& quantized_kind(QuantizedKind kind) {
  for (const QuantizedKindSpec& spec : quantized_kinds())
    if (spec.kind == kind) return spec;
  throw std::logic_error("quantized kind without an entry in quantized_kinds()");
}

}  // namespace attnreplay
