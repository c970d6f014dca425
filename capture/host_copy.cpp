#include "capture/host_copy.h"

#include <ATen/ATen.h>

#include <cstring>

#include "formats/torch_tensor.h"

#ifdef ATTNCAP_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <mutex>
#include <unordered_map>
#endif

namespace attnreplay::capture {

struct HostCopy::Pending {
  at::Tensor snapshot;  // the device-to-device clone
  HostTensor shape_only;
#ifdef ATTNCAP_WITH_CUDA
  at::cuda::CUDAEvent produced;  // the clone is complete once this fires
#endif
};

#ifdef ATTNCAP_WITH_CUDA
namespace {

// One side stream per device, taken once from torch's pool. Never destroyed: copies may still be
// finishing while the process exits.
c10::cuda::CUDAStream side_stream(c10::DeviceIndex device) {
  static auto* mutex = new std::mutex;
  static auto* streams = new std::unordered_map<c10::DeviceIndex, c10::cuda::CUDAStream>;
  std::lock_guard lock(*mutex);
  auto found = streams->find(device);
  if (found == streams->end()) found = streams->emplace(device, c10::cuda::getStreamFromPool(false, device)).first;
  return found->second;
}

}  // namespace
#endif

bool HostCopy::device_is_capturing_graph(const at::Tensor& tensor) {
#ifdef ATTNCAP_WITH_CUDA
  if (!tensor.is_cuda()) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const auto stream = c10::cuda::getCurrentCUDAStream(tensor.device().index());
  return cudaStreamIsCapturing(stream.stream(), &status) == cudaSuccess && status != cudaStreamCaptureStatusNone;
#else
  (void)tensor;
  return false;
#endif
}

void HostCopy::allow_copies_during_graph_capture() {
#ifdef ATTNCAP_WITH_CUDA
  thread_local const bool relaxed = [] {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    return cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
  }();
  (void)relaxed;
#endif
}

void HostCopy::prepare_device(const at::Tensor& tensor) {
#ifdef ATTNCAP_WITH_CUDA
  if (!tensor.is_cuda()) return;
  // Everything finish() uses is created here, once, so that it exists before the exit handler
  // that flushes capture is registered: what is created later is destroyed before it runs.
  const c10::DeviceIndex device = tensor.device().index();
  c10::cuda::CUDAGuard device_guard(device);
  const c10::cuda::CUDAStream side = side_stream(device);
  at::cuda::CUDAEvent event;
  event.record(c10::cuda::getCurrentCUDAStream(device));
  event.block(side);
  c10::cuda::CUDAStreamGuard stream_guard(side);
  at::Tensor probe = at::zeros({1}, tensor.options()).clone();
  c10::cuda::CUDACachingAllocator::recordStream(probe.storage().data_ptr(), side);
  (void)probe.to(at::kCPU);
#else
  (void)tensor;
#endif
}

namespace {

// A device tensor's snapshot: `owned` when nothing else holds it; else a copy on the producer's
// current stream, ordered after whatever produced the tensor and before anything the model does to
// it next (one copy: a strided tensor's contiguous() is already one).
at::Tensor snapshot_of(const at::Tensor& tensor, bool owned) {
  if (owned && tensor.is_contiguous()) return tensor;
  return tensor.is_contiguous() ? tensor.clone() : tensor.contiguous();
}

}  // namespace

HostCopy HostCopy::start_copy(const at::Tensor& tensor, bool owned) {
  HostCopy copy;
  copy.nbytes_ = static_cast<std::uint64_t>(tensor.numel()) * tensor.element_size();
#ifdef ATTNCAP_WITH_CUDA
  if (tensor.is_cuda()) {
    const c10::DeviceIndex device = tensor.device().index();
    c10::cuda::CUDAGuard device_guard(device);
    auto pending = std::make_shared<Pending>();
    pending->snapshot = snapshot_of(tensor, owned);
    pending->produced.record(c10::cuda::getCurrentCUDAStream(device));
    pending->shape_only = tensor_description(tensor);
    copy.pending_ = std::move(pending);
    return copy;
  }
#endif
  (void)owned;
  copy.ready_ = host_tensor_from_torch(tensor);
  return copy;
}

HostCopy HostCopy::start(const at::Tensor& tensor) { return start_copy(tensor, /*owned=*/false); }

HostCopy HostCopy::take(at::Tensor made_for_capture) { return start_copy(made_for_capture, /*owned=*/true); }

HostTensor HostCopy::finish() {
  if (ready_) return std::move(*ready_);
  HostTensor host = std::move(pending_->shape_only);
#ifdef ATTNCAP_WITH_CUDA
  allow_copies_during_graph_capture();
  const c10::DeviceIndex device = pending_->snapshot.device().index();
  c10::cuda::CUDAGuard device_guard(device);
  const c10::cuda::CUDAStream side = side_stream(device);
  pending_->produced.block(side);
  // The clone is freed on another stream than the one that made it: tell the allocator.
  c10::cuda::CUDACachingAllocator::recordStream(pending_->snapshot.storage().data_ptr(), side);
  at::Tensor on_host;
  {
    c10::cuda::CUDAStreamGuard stream_guard(side);
    on_host = pending_->snapshot.to(at::kCPU);  // waits for the copy, on this thread only
  }
  auto bytes = std::make_shared<std::vector<std::byte>>(on_host.nbytes());
  if (!bytes->empty()) std::memcpy(bytes->data(), on_host.data_ptr(), bytes->size());
  host.bytes = std::move(bytes);
#endif
  pending_.reset();
  return host;
}

}  // namespace attnreplay::capture
