#include "formats/host_tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

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

std::vector<std::int64_t> HostTensor::to_integers() const {
  std::vector<std::int64_t> values(static_cast<std::size_t>(numel()));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<std::int64_t>(at(static_cast<std::int64_t>(i)));
  return values;
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

HostTensor with_shape(HostTensor tensor, std::vector<std::int64_t> shape) {
  const std::int64_t before = tensor.numel();
  tensor.shape = std::move(shape);
  ATTNREPLAY_ASSERT(tensor.numel() == before, "with_shape: another number of elements");
  tensor.captured_strides.clear();
  return tensor;
}

HostTensor int32_tensor(const std::vector<std::int64_t>& values) {
  HostTensor tensor = HostTensor::allocate(DType::int32, {static_cast<std::int64_t>(values.size())});
  auto* out = reinterpret_cast<std::int32_t*>(tensor.mutable_data());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = static_cast<std::int32_t>(values[i]);
  return tensor;
}

HostTensor last_dim_slice(const HostTensor& tensor, std::int64_t first, std::int64_t count) {
  std::vector<std::int64_t> shape = tensor.shape;
  const std::int64_t width = shape.back();
  shape.back() = count;
  HostTensor part = HostTensor::allocate(tensor.dtype, shape);
  const std::size_t es = dtype_size(tensor.dtype);
  const std::int64_t rows = tensor.numel() / std::max<std::int64_t>(width, 1);
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memcpy(part.mutable_data() + static_cast<std::size_t>(r * count) * es,
                tensor.data() + static_cast<std::size_t>(r * width + first) * es, static_cast<std::size_t>(count) * es);
  }
  return part;
}

HostTensor last_dim_concat(const HostTensor& a, const HostTensor& b) {
  std::vector<std::int64_t> shape = a.shape;
  const std::int64_t wa = a.shape.back(), wb = b.shape.back();
  shape.back() = wa + wb;
  HostTensor joined = HostTensor::allocate(a.dtype, shape);
  const std::size_t es = dtype_size(a.dtype);
  const std::int64_t rows = a.numel() / std::max<std::int64_t>(wa, 1);
  for (std::int64_t r = 0; r < rows; ++r) {
    std::byte* to = joined.mutable_data() + static_cast<std::size_t>(r * (wa + wb)) * es;
    std::memcpy(to, a.data() + static_cast<std::size_t>(r * wa) * es, static_cast<std::size_t>(wa) * es);
    std::memcpy(to + static_cast<std::size_t>(wa) * es, b.data() + static_cast<std::size_t>(r * wb) * es,
                static_cast<std::size_t>(wb) * es);
  }
  return joined;
}

}  // namespace attnreplay
