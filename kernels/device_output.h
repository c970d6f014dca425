#pragma once
// For prepared kernels whose output already is a torch tensor (a GPU kernel's, on the GPU): the
// runner compares it where the reference is, without the trip through the host that output()
// makes (a download, then an upload for the comparison). kernel.h stays free of libtorch; kernels
// that can, implement this beside PreparedKernel.
#include <ATen/core/Tensor.h>

namespace attnreplay {

class DeviceOutput {
 public:
  virtual ~DeviceOutput() = default;
  // The last run's output as (batch, heads_q, seq_q, head_dim_vo), on its device, any strides,
  // after the work that makes it has finished. Valid until the kernel runs again or is destroyed.
  virtual at::Tensor device_output() = 0;
};

}  // namespace attnreplay
