#include "kernels/torch_inputs.h"

#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>

#ifdef ATTNREPLAY_TORCH_CUDA
#include <cuda_runtime_api.h>
#endif

#include <map>
#include <tuple>

#include "formats/torch_tensor.h"

namespace attnreplay {
namespace {

// Keyed by the bytes and how they are read; an entry holds the bytes, so their address cannot be
// reused by another tensor while it lives.
using UploadKey = std::tuple<const void*, DType, std::vector<std::int64_t>, int, int>;
struct Upload {
  std::shared_ptr<const std::vector<std::byte>> bytes;
  at::Tensor copy;
};
thread_local std::map<UploadKey, Upload>* shared_uploads = nullptr;

constexpr std::size_t kPinnedFrom = 1 << 20;  // smaller tensors go up as fast from pageable memory

}  // namespace

SharedUploads::SharedUploads() : owns_(shared_uploads == nullptr) {
  if (owns_) shared_uploads = new std::map<UploadKey, Upload>();
}

SharedUploads::~SharedUploads() {
  if (!owns_) return;  // an inner scope: the outer one's copies live on
  delete shared_uploads;
  shared_uploads = nullptr;
}

at::Tensor device_copy(const HostTensor& tensor, at::Device device) {
  const at::Tensor host = torch_view_of_host_tensor(tensor);
  if (device.is_cpu()) return host;
  if (!shared_uploads || !tensor.bytes) return host.to(device);
  UploadKey key{tensor.bytes.get(), tensor.dtype, tensor.shape, static_cast<int>(device.type()), device.index()};
  auto found = shared_uploads->find(key);
  if (found == shared_uploads->end()) {
    found = shared_uploads->emplace(std::move(key), Upload{tensor.bytes, host.to(device)}).first;
  }
  return found->second.copy;
}

BytePool::Hooks pinned_memory(int device) {
  BytePool::Hooks hooks;
#ifdef ATTNREPLAY_TORCH_CUDA
  // Made on the thread that reads ahead, which has not picked a GPU yet: the process's.
  hooks.on_new = [device](Bytes& bytes) {
    if (bytes.size() < kPinnedFrom) return;
    if (cudaSetDevice(device) != cudaSuccess ||
        cudaHostRegister(bytes.data(), bytes.size(), cudaHostRegisterPortable) != cudaSuccess) {
      cudaGetLastError();  // not pinned: it goes up from pageable memory, slower
    }
  };
  hooks.on_drop = [](Bytes& bytes) {
    if (bytes.size() >= kPinnedFrom && cudaHostUnregister(bytes.data()) != cudaSuccess) cudaGetLastError();
  };
#else
  static_cast<void>(device);
#endif
  return hooks;
}

PackedKeyRows packed_key_rows(const AttentionCall& call, at::Device device) {
  const std::int64_t page_size = call.k.shape.at(1);
  const HostTensor& table = *call.block_table;
  std::vector<std::int64_t> rows, offsets{0};
  const auto sequences = call.sequences();
  for (std::size_t b = 0; b < sequences.size(); ++b) {
    for (std::int64_t t = 0; t < sequences[b].k_len; ++t) {
      const auto page = static_cast<std::int64_t>(table.at(static_cast<std::int64_t>(b) * table.shape[1] + t / page_size));
      rows.push_back(page * page_size + t % page_size);
    }
    offsets.push_back(offsets.back() + sequences[b].k_len);
  }
  const auto longs = at::TensorOptions().dtype(at::kLong);
  return {at::tensor(rows, longs).to(device), at::tensor(offsets, longs).to(device).to(at::kInt)};
}

at::Tensor bhsd_view(at::Tensor tensor, Layout layout) {
  if (layout == Layout::thd) {
    // Packed rows (t, h, d) are one sequence of t; pages (p, page_size, h, d) one of p * page_size.
    if (tensor.dim() == 4) tensor = tensor.flatten(0, 1);
    return tensor.transpose(0, 1).unsqueeze(0);
  }
  if (tensor.dim() == 3) return tensor.unsqueeze(1);
  return layout == Layout::bshd ? tensor.transpose(1, 2) : tensor;
}

at::Tensor visible_keys_mask(const AttentionCall& call, const AttentionShape& s, const at::Tensor& rows) {
  const at::Tensor diagonal = rows.unsqueeze(1) + call.diagonal_offset(s);
  const at::Tensor keys = at::arange(s.seq_kv, rows.options()).unsqueeze(0);
  at::Tensor allowed = at::ones({rows.size(0), s.seq_kv}, rows.options().dtype(at::kBool));
  if (call.is_causal) allowed.logical_and_(keys <= diagonal);
  if (call.window_right) allowed.logical_and_(keys <= diagonal + *call.window_right);
  if (call.window_left) allowed.logical_and_(keys >= diagonal - *call.window_left);
  return allowed;
}

ModelInputs model_inputs(const AttentionCall& call, at::Device device, bool writable) {
  auto as_model_had = [&](const HostTensor& tensor) {
    const at::Tensor shared = device_copy(tensor, device);
    const at::Tensor strided = with_captured_strides(shared, tensor);
    return writable && strided.is_same(shared) ? shared.clone() : strided;
  };
  ModelInputs in{bhsd_view(as_model_had(call.q), call.layout), bhsd_view(as_model_had(call.k), call.layout),
                 bhsd_view(as_model_had(call.v), call.layout), std::nullopt};
  if (call.mask) in.mask = as_model_had(*call.mask);
  return in;
}

at::Device current_gpu() { return at::Device(at::kCUDA, at::detail::getCUDAHooks().current_device()); }

}  // namespace attnreplay
