#pragma once
// The CPU emulations of attnreplay's own kernels (docs/quantized.md) as kernels, "<kind>-cpu", one
// for each entry of kernels/quantized_kinds.h. Preparation (layout change, K smoothing,
// quantization) is timed apart from the attention, as for the CUDA versions.
#include "kernels/quantized_kernel.h"

namespace attnreplay {

class EmulatedAttentionKernel : public QuantizedAttentionKernel {
 public:
  explicit EmulatedAttentionKernel(const QuantizedKindSpec& spec);
  std::optional<std::string> unsupported_reason(const AttentionCall& call) const override;
  std::unique_ptr<PreparedKernel> prepare(const AttentionCall& call, const KernelOptions& options) const override;
};

}  // namespace attnreplay
