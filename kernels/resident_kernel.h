#pragma once
// For kernels that can compute a call on the model's own tensors where the model has them: kernel
// substitution (docs/capture.md) then hands a GPU job's Q, K, V and mask to the kernel on the GPU
// and gives the job the kernel's output there, queued on the job's stream like the op it replaces.
// Through PreparedKernel every call would go to the host and back and wait, which is right for a
// replay, where inputs come from a file and are timed apart, but makes a substituted job's step
// many times slower than either kernel. kernel.h stays free of libtorch; kernels that can,
// implement this beside Kernel.
#include <ATen/core/Tensor.h>

#include "kernels/kernel.h"
#include "kernels/torch_inputs.h"

namespace attnreplay {

class ResidentKernel {
 public:
  virtual ~ResidentKernel() = default;
  // `call`'s attention over `inputs`: a dense call's tensors as the model has them, (b, h, s, d) views
  // on the device the kernel's description names, never written to. The call's HostTensors carry their shapes and dtypes; their bytes need not be there.
  // Returns the output as (batch, heads_q, seq_q, head_dim_vo) on the inputs' device, its work queued
  // on torch's current stream and not waited for. The call has passed kernel_declines(); a check
  // that needs the tensors throws KernelNotSupported, as prepare() does.
  virtual at::Tensor run_resident(const AttentionCall& call, const ModelInputs& inputs,
                                  const KernelOptions& options) const = 0;
};

}  // namespace attnreplay
