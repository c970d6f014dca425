#pragma once
// attnreplay's own CUDA attention kernels (flash, sage1-int8, sage2-int8-fp8, fa3-fp8; device code
// in kernels/cuda/) as registered Kernels: each kind is one file that registers a
// CudaAttentionKernel. The quantized kinds take the process-wide quant_options(), as their CPU
// emulations do, so that one set of flags drives both.
#include "kernels/quantized_kernel.h"

namespace attnreplay {

class CudaAttentionKernel : public QuantizedAttentionKernel {
 public:
  using QuantizedAttentionKernel::QuantizedAttentionKernel;
  std::optional<std::string> unsupported_reason(const AttentionCall& call) const override;
  // Uploads, prepares on the GPU (layout change, K smoothing, quantization) with the options as
  // they are now, and waits, so that a fault shows up here.
  std::unique_ptr<PreparedKernel> prepare(const AttentionCall& call) const override;
};

}  // namespace attnreplay
