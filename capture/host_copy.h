#pragma once
// Copies a tensor the model is using to host memory for capture, without touching it and without
// making the model's thread wait for a GPU. CPU tensors are copied at once. A CUDA tensor is cloned
// on the stream that produced it (ordered after its producer, and safe from later in-place writes:
// a device-to-device copy, microseconds on the model's thread); finish(), on capture's own thread,
// copies the clone to the host on a side stream and lets the clone go.
#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>

#include "formats/host_tensor.h"

namespace attnreplay::capture {

class HostCopy {
 public:
  static HostCopy start(const at::Tensor& tensor);
  // For a tensor capture made itself on the job's stream (a paged cache's gathered pages), which
  // nothing else holds or writes: kept as it is, where start() would clone it again.
  static HostCopy take(at::Tensor made_for_capture);
  // Creates, once, what copying from this tensor's device needs (call before the first start()).
  static void prepare_device(const at::Tensor& tensor);
  // True while the current stream of the tensor's device records a CUDA graph: a copy made now
  // would become part of the graph, and the graph's replays bypass the dispatcher anyway.
  static bool device_is_capturing_graph(const at::Tensor& tensor);
  // Called by finish() on capture's own threads: while the job's thread captures a CUDA graph
  // (torch's default, global mode), a copy from any other thread would invalidate the job's graph;
  // in relaxed mode this thread's copies are allowed and leave the graph alone.
  static void allow_copies_during_graph_capture();
  // The host tensor, with the model's strides and device recorded. Waits for a pending copy.
  HostTensor finish();
  std::uint64_t nbytes() const { return nbytes_; }

 private:
  static HostCopy start_copy(const at::Tensor& tensor, bool owned);
  struct Pending;
  std::optional<HostTensor> ready_;
  std::shared_ptr<Pending> pending_;
  std::uint64_t nbytes_ = 0;
};

}  // namespace attnreplay::capture
