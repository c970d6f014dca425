#pragma once
// A tensor held in host memory, contiguous in row-major order of `shape`. The strides the model's
// tensor had are kept beside it, because layout is part of what was captured and replayed.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "formats/dtype.h"

namespace attnreplay {

struct HostTensor {
  DType dtype = DType::float32;
  std::vector<std::int64_t> shape;
  // Element strides of the model's tensor; empty when unknown (then contiguous is assumed).
  std::vector<std::int64_t> captured_strides;
  // Device the model's tensor lived on, e.g. "cpu" or "cuda:0".
  std::string device = "cpu";
  // Shared so that copies of a call (and deduplicated tensors) cost nothing.
  std::shared_ptr<const std::vector<std::byte>> bytes;

  static HostTensor allocate(DType dtype, std::vector<std::int64_t> shape);
  static HostTensor from_doubles(DType dtype, std::vector<std::int64_t> shape,
                                 std::span<const double> values);

  std::int64_t numel() const;
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  int rank() const { return static_cast<int>(shape.size()); }
  const std::byte* data() const { return bytes ? bytes->data() : nullptr; }
  // Writable access for freshly allocated tensors; callers must hold the only reference.
  std::byte* mutable_data();
  double at(std::int64_t flat_index) const;
  std::vector<double> to_doubles() const;
  // An integer tensor's values (offsets, counts, a block table).
  std::vector<std::int64_t> to_integers() const;
  std::vector<std::int64_t> contiguous_strides() const;
  // True when the captured strides equal the row-major ones (or are unknown).
  bool captured_contiguous() const;
};

std::string shape_string(const std::vector<std::int64_t>& shape);  // "2x24x4250x64"

// The same bytes under another shape of as many elements (a packed (T, H, D) as pages of one token,
// (T, 1, H, D)); the captured strides go, since they were the other shape's.
HostTensor with_shape(HostTensor tensor, std::vector<std::int64_t> shape);
// A one-dimensional int32 tensor of `values`.
HostTensor int32_tensor(const std::vector<std::int64_t>& values);
// Channels [first, first + count) of the last dim of every row.
HostTensor last_dim_slice(const HostTensor& tensor, std::int64_t first, std::int64_t count);
// The rows of `a` and `b` side by side along the last dim (the other dims equal).
HostTensor last_dim_concat(const HostTensor& a, const HostTensor& b);

}  // namespace attnreplay
