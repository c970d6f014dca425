#pragma once
// Conversions between HostTensor and libtorch tensors. Only the few files that already pay for
// libtorch's headers include this.
#include <ATen/core/Tensor.h>

#include "formats/host_tensor.h"

namespace attnreplay {

c10::ScalarType torch_scalar_type(DType dtype);
// Throws InputError for element types attention calls never carry (complex, quantized, ...).
DType dtype_from_torch(c10::ScalarType type);
// Copies to host, contiguous; the tensor's strides and device are recorded.
HostTensor host_tensor_from_torch(const at::Tensor& tensor);
// A CPU tensor with the recorded strides restored (same memory layout as the model's tensor:
// transposed views stay transposed, expanded dims stay expanded), or contiguous when asked.
at::Tensor torch_from_host_tensor(const HostTensor& tensor, bool restore_strides = true);

}  // namespace attnreplay
