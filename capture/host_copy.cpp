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
  at::Tensor pinned;
  HostTensor shape_only;
#ifdef ATTNCAP_WITH_CUDA
  at::cuda::CUDAEvent copied;
#endif
};

#ifdef ATTNCAP_WITH_CUDA
namespace {

// One side stream per device, taken once from torch's pool.
c10::cuda::CUDAStream side_stream(c10::DeviceIndex device) {
  static std::mutex mutex;
  static std::unordered_map<c10::DeviceIndex, c10::cuda::CUDAStream> streams;
  std::lock_guard lock(mutex);
  auto found = streams.find(device);
  if (found == streams.end()) found = streams.emplace(device, c10::cuda::getStreamFromPool(false, device)).first;
  return found->second;
}

}  // namespace
#endif

HostCopy HostCopy::start(const at::Tensor& tensor) {
  HostCopy copy;
  copy.nbytes_ = static_cast<std::uint64_t>(tensor.numel()) * tensor.element_size();
#ifdef ATTNCAP_WITH_CUDA
  if (tensor.is_cuda()) {
    const c10::DeviceIndex device = tensor.device().index();
    c10::cuda::CUDAGuard device_guard(device);
    const c10::cuda::CUDAStream producer = c10::cuda::getCurrentCUDAStream(device);
    // A device-to-device clone on the producer's stream: it sees exactly what the op saw, even if
    // the model later writes to the tensor in place (a KV cache, say).
    at::Tensor snapshot = tensor.contiguous().clone();
    at::cuda::CUDAEvent produced;
    produced.record(producer);
    const c10::cuda::CUDAStream side = side_stream(device);
    produced.block(side);
    auto pending = std::make_shared<Pending>();
    pending->pinned = at::empty(tensor.sizes(), tensor.options().device(at::kCPU).pinned_memory(true));
    {
      c10::cuda::CUDAStreamGuard stream_guard(side);
      pending->pinned.copy_(snapshot, /*non_blocking=*/true);
    }
    // The caching allocator must not reuse the clone's memory before the side stream is done.
    c10::cuda::CUDACachingAllocator::recordStream(snapshot.storage().data_ptr(), side);
    pending->copied.record(side);
    pending->shape_only.dtype = dtype_from_torch(tensor.scalar_type());
    pending->shape_only.shape = tensor.sizes().vec();
    pending->shape_only.captured_strides = tensor.strides().vec();
    pending->shape_only.device = tensor.device().str();
    copy.pending_ = std::move(pending);
    return copy;
  }
#endif
  copy.ready_ = host_tensor_from_torch(tensor);
  return copy;
}

HostTensor HostCopy::finish() {
  if (ready_) return std::move(*ready_);
#ifdef ATTNCAP_WITH_CUDA
  pending_->copied.synchronize();
#endif
  HostTensor host = std::move(pending_->shape_only);
  auto bytes = std::make_shared<std::vector<std::byte>>(pending_->pinned.nbytes());
  if (!bytes->empty()) std::memcpy(bytes->data(), pending_->pinned.data_ptr(), bytes->size());
  host.bytes = std::move(bytes);
  pending_.reset();  // pinned memory goes back to torch's host allocator
  return host;
}

}  // namespace attnreplay::capture
