#include "formats/host_tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "formats/errors.h"

namespace attnreplay {

HostTensor HostTensor::allocate(DType dtype, std::vector<std::int64_t> shape) {
  HostTensor tensor;
  tensor.dtype = dtype;
  tensor.shape = std::move(shape);
  tensor.bytes = std::make_shared<std::vector<std::byte>>(tensor.nbytes());
  return tensor;
}

HostTensor HostTensor::from_doubles(DType dtype, std::vector<std::int64_t> shape,
                                    std::span<const double> values) {
  HostTensor tensor = allocate(dtype, std::move(shape));
  ATTNREPLAY_ASSERT(static_cast<std::int64_t>(values.size()) == tensor.numel(), "value count");
  std::byte* out = tensor.mutable_data();
  const std::size_t size = dtype_size(dtype);
  for (std::size_t i = 0; i < values.size(); ++i) element_from_double(dtype, values[i], out + i * size);
  return tensor;
}

std::int64_t HostTensor::numel() const {
  std::int64_t count = 1;
  for (std::int64_t dim : shape) count *= dim;
  return count;
}

std::byte* HostTensor::mutable_data() {
  ATTNREPLAY_ASSERT(bytes && bytes.use_count() == 1, "mutable_data on a shared tensor");
  return const_cast<std::vector<std::byte>&>(*bytes).data();
}

double HostTensor::at(std::int64_t flat_index) const {
  return element_to_double(dtype, data() + static_cast<std::size_t>(flat_index) * dtype_size(dtype));
}

std::vector<double> HostTensor::to_doubles() const {
  std::vector<double> values(static_cast<std::size_t>(numel()));
  const std::size_t size = dtype_size(dtype);
  const std::byte* in = data();
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = element_to_double(dtype, in + i * size);
  return values;
}

std::vector<std::int64_t> HostTensor::contiguous_strides() const {
  std::vector<std::int64_t> strides(shape.size(), 1);
  for (int i = rank() - 2; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
  return strides;
}

bool HostTensor::captured_contiguous() const {
  if (captured_strides.empty()) return true;
  const auto strides = contiguous_strides();
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] != 1 && captured_strides[i] != strides[i]) return false;
  }
  return true;
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  if (shape.empty()) return "scalar";
  return fmt::format("{}", fmt::join(shape, "x"));
}

}  // namespace attnreplay
