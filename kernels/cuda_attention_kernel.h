#pragma once
// attnreplay's own CUDA attention kernels (device code in kernels/cuda/) as registered Kernels, one
// for each entry of kernels/quantized_kinds.h. They prepare a call with the options the run gives
// (KernelOptions::quant), as their CPU emulations do, so that one set of flags drives both.
#include "kernels/quantized_kernel.h"

namespace attnreplay {

class CudaAttentionKernel : public QuantizedAttentionKernel {
 public:
  explicit CudaAttentionKernel(const QuantizedKindSpec& spec);
  std::optional<std::string> unsupported_reason(const AttentionCall& call) const override;
  // Uploads, prepares on the GPU (layout change, K smoothing, quantization) and waits, so that a
  // fault shows up here.
  std::unique_ptr<PreparedKernel> prepare(const AttentionCall& call, const KernelOptions& options) const override;
};

}  // namespace attnreplay
