#pragma once
// The CPU emulations of attnreplay's own kernels (docs/quantized.md) as kernels: each kind is one
// file that registers an EmulatedAttentionKernel. Preparation (layout change, K smoothing,
// quantization) is timed apart from the attention, as for the CUDA versions.
#include "kernels/quantized_kernel.h"

namespace attnreplay {

class EmulatedAttentionKernel : public QuantizedAttentionKernel {
 public:
  using QuantizedAttentionKernel::QuantizedAttentionKernel;
  std::optional<std::string> unsupported_reason(const AttentionCall& call) const override;
  // Takes the process-wide quant_options() as they are now.
  std::unique_ptr<PreparedKernel> prepare(const AttentionCall& call) const override;
};

}  // namespace attnreplay
