#pragma once
// Copies a tensor the model is using to host memory for capture, without touching it and without
// making the model's thread wait for a GPU. CPU tensors are copied at once. A CUDA tensor is cloned
// on the stream that produced it (ordered after its producer, and safe from later in-place writes),
// then copied into pinned host memory on a side stream; finish() waits for that copy, on the
// writer thread.
#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>

#include "formats/host_tensor.h"

namespace attnreplay::capture {

class HostCopy {
 public:
  static HostCopy start(const at::Tensor& tensor);
  // The host tensor, with the model's strides and device recorded. Waits for a pending copy.
  HostTensor finish();
  std::uint64_t nbytes() const { return nbytes_; }

 private:
  struct Pending;
  std::optional<HostTensor> ready_;
  std::shared_ptr<Pending> pending_;
  std::uint64_t nbytes_ = 0;
};

}  // namespace attnreplay::capture
