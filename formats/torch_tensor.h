#pragma once
// Conversions between HostTensor and libtorch tensors. Only the few files that already pay for
// libtorch's headers include this.
#include <ATen/core/Tensor.h>

#include "formats/host_tensor.h"

namespace attnreplay {

c10::ScalarType torch_scalar_type(DType dtype);
// Throws InputError for element types attention calls never carry (complex, quantized, ...).
DType dtype_from_torch(c10::ScalarType type);
// The tensor's dtype, shape, strides and device, without its bytes: what a record says of a tensor
// that stays where it is (kernel substitution on the job's own tensors).
HostTensor tensor_description(const at::Tensor& tensor);
// Copies to host, contiguous; the tensor's strides and device are recorded.
HostTensor host_tensor_from_torch(const at::Tensor& tensor);
// A CPU tensor with the recorded strides restored (same memory layout as the model's tensor:
// transposed views stay transposed, expanded dims stay expanded), or contiguous when asked.
at::Tensor torch_from_host_tensor(const HostTensor& tensor, bool restore_strides = true);
// The host bytes themselves as a contiguous CPU tensor, without a copy (it keeps them alive): for
// reading and uploading only, since the bytes may be shared with other copies of the call.
at::Tensor torch_view_of_host_tensor(const HostTensor& tensor);
// `contiguous` (on any device, in `tensor`'s shape) copied into the strides `tensor` recorded, as
// torch_from_host_tensor restores them; itself when those are contiguous or unknown.
at::Tensor with_captured_strides(const at::Tensor& contiguous, const HostTensor& tensor);

}  // namespace attnreplay
