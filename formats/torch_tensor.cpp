#include "formats/torch_tensor.h"

#include <ATen/ATen.h>

#include <cstring>

#include "formats/byte_pool.h"
#include "formats/errors.h"

namespace attnreplay {

c10::ScalarType torch_scalar_type(DType dtype) {
  switch (dtype) {
    case DType::float64: return at::kDouble;
    case DType::float32: return at::kFloat;
    case DType::float16: return at::kHalf;
    case DType::bfloat16: return at::kBFloat16;
    case DType::float8_e4m3fn: return at::kFloat8_e4m3fn;
    case DType::float8_e5m2: return at::kFloat8_e5m2;
    case DType::int64: return at::kLong;
    case DType::int32: return at::kInt;
    case DType::int8: return at::kChar;
    case DType::uint8: return at::kByte;
    case DType::boolean: return at::kBool;
  }
  return at::kFloat;
}

DType dtype_from_torch(c10::ScalarType type) {
  for (DType dtype : kAllDTypes) {
    if (torch_scalar_type(dtype) == type) return dtype;
  }
  throw InputError(fmt::format("tensors of type {} are not supported", c10::toString(type)));
}

HostTensor tensor_description(const at::Tensor& tensor) {
  HostTensor described;
  described.dtype = dtype_from_torch(tensor.scalar_type());
  described.shape = tensor.sizes().vec();
  described.captured_strides = tensor.strides().vec();
  described.device = tensor.device().str();
  return described;
}

HostTensor host_tensor_from_torch(const at::Tensor& tensor) {
  HostTensor host = tensor_description(tensor);
  const at::Tensor contiguous = tensor.to(at::kCPU).contiguous();
  auto bytes = allocate_bytes(contiguous.nbytes());
  if (!bytes->empty()) std::memcpy(bytes->data(), contiguous.data_ptr(), bytes->size());
  host.bytes = std::move(bytes);
  return host;
}

at::Tensor torch_view_of_host_tensor(const HostTensor& tensor) {
  const auto options = at::TensorOptions().dtype(torch_scalar_type(tensor.dtype)).device(at::kCPU);
  if (tensor.nbytes() == 0) return at::empty(tensor.shape, options);
  ATTNREPLAY_ASSERT(tensor.data() && tensor.bytes->size() == tensor.nbytes(), "tensor without data");
  // The view holds a reference to the bytes, so it may outlive the HostTensor it came from.
  auto bytes = tensor.bytes;
  return at::from_blob(const_cast<std::byte*>(bytes->data()), tensor.shape,
                       [bytes](void*) mutable { bytes.reset(); }, options);
}

at::Tensor with_captured_strides(const at::Tensor& contiguous, const HostTensor& tensor) {
  if (tensor.captured_contiguous() || tensor.captured_strides.size() != tensor.shape.size()) return contiguous;
  // Dims of stride 0 were expanded: keep one slice and expand it again, as the model did.
  std::vector<std::int64_t> base_shape = tensor.shape;
  std::vector<std::int64_t> base_strides = tensor.captured_strides;
  at::Tensor source = contiguous;
  bool expanded = false;
  for (std::size_t d = 0; d < base_shape.size(); ++d) {
    if (base_strides[d] < 0) return contiguous;
    if (base_strides[d] == 0 && base_shape[d] > 1) {
      source = source.narrow(static_cast<std::int64_t>(d), 0, 1);
      base_shape[d] = 1;
      expanded = true;
    }
  }
  try {
    at::Tensor strided = at::empty_strided(base_shape, base_strides, contiguous.options());
    strided.zero_();  // gaps between rows (a slice of a fused QKV) hold zeros, never garbage
    strided.copy_(source);
    return expanded ? strided.expand(tensor.shape) : strided;
  } catch (const c10::Error&) {
    return contiguous;  // overlapping strides cannot be written to; the values are what matter
  }
}

at::Tensor torch_from_host_tensor(const HostTensor& tensor, bool restore_strides) {
  const at::Tensor contiguous = torch_view_of_host_tensor(tensor).clone();
  return restore_strides ? with_captured_strides(contiguous, tensor) : contiguous;
}

}  // namespace attnreplay
