#pragma once
// attnreplay's own CUDA attention kernels (device code in kernels/cuda/) as registered Kernels, one
// for each entry of kernels/quantized_kinds.h. They prepare a call with the options the run gives
// (KernelOptions::quant), as their CPU emulations do, so that one set of flags drives both.
#include "kernels/quantized_kernel.h"
#include "kernels/resident_kernel.h"

namespace attnreplay {

class CudaAttentionKernel : public QuantizedAttentionKernel, public ResidentKernel {
 public:
  explicit CudaAttentionKernel(const QuantizedKindSpec& spec);
  std::optional<std::string> unsupported_reason(const AttentionCall& call) const override;
  // Uploads, prepares on the GPU (layout change, K smoothing, quantization) and waits, so that a
  // fault shows up here.
  std::unique_ptr<PreparedKernel> prepare(const AttentionCall& call, const KernelOptions& options) const override;

  // On the model's tensors where they are bshd- or bhsd-contiguous (others are made so first), with
  // work buffers from torch's caching allocator: nothing waits.
  at::Tensor run_resident(const AttentionCall& call, const ModelInputs& inputs,
                          const KernelOptions& options) const override;
};

}  // namespace attnreplay
