#pragma once
// A call's Q, K, V and mask as libtorch tensors on a device, as the model passed them: the kernels
// that hand tensors to torch (its SDPA backends, Python plug-ins) and the GPU reference start
// from these.
#include <ATen/core/Tensor.h>

#include <optional>

#include "formats/attention_call.h"
#include "formats/byte_pool.h"

namespace attnreplay {

// `tensor` on `device`, contiguous in its own shape, copied straight from the host bytes (on the
// CPU: those bytes themselves). While a SharedUploads lives on this thread, each host tensor goes
// to each device once: the reference, every kernel and every comparison of a call share that
// copy. Callers read it and never write to it.
at::Tensor device_copy(const HostTensor& tensor, at::Device device);

// Memory for calls read ahead, page-locked for the copy engine: device_copy() then moves it at
// about 50 GB/s rather than the 8 GB/s of pageable memory on the H100 machine
// (bench/results/2026-11-24-h100-scale/README.md). `device` is the GPU it will go to. Without
// CUDA, or where pinning fails, the memory stays pageable.
BytePool::Hooks pinned_memory(int device);

// Scope of the shared copies: one call's replay. They are freed when it ends.
class SharedUploads {
 public:
  SharedUploads();
  ~SharedUploads();
  SharedUploads(const SharedUploads&) = delete;
  SharedUploads& operator=(const SharedUploads&) = delete;

 private:
  bool owns_;
};

// A call's Q, K, V or output as (b, h, s, d): a view (BSHD is transposed; a 3-dim tensor gets a
// head dim of 1; THD rows become one sequence, as AttentionCall::shape() counts them).
at::Tensor bhsd_view(at::Tensor tensor, Layout layout);

// Which keys each query row of `rows` (a 1-D tensor of int64 positions) may see by causality and
// the window, as a (rows, s_kv) bool tensor on rows' device: AttentionCall::visible_keys for many
// rows at once. A mask may hide more.
at::Tensor visible_keys_mask(const AttentionCall& call, const AttentionShape& s, const at::Tensor& rows);

// Q, K, V with the model's strides restored, as (b, h, s, d) views (BSHD calls are transposed
// views, which cost nothing); the mask as captured.
struct ModelInputs {
  at::Tensor q, k, v;
  std::optional<at::Tensor> mask;
};

// Read-only, they may be the shared copies (device_copy); `writable` gives the kernel its own, for
// code that may write into its inputs (a user's plug-in).
ModelInputs model_inputs(const AttentionCall& call, at::Device device, bool writable = false);

// A paged call's keys as packed rows, for kernels that read no block table: `rows` indexes the
// pages flattened to (pages * page_size, heads_kv, dim), each sequence's keys in turn (int64, on
// `device`); `cu_seqlens_k` are the packed keys' offsets (int32). k.flatten(0, 1).index_select(0,
// rows) gathers them.
struct PackedKeyRows {
  at::Tensor rows, cu_seqlens_k;
};
PackedKeyRows packed_key_rows(const AttentionCall& call, at::Device device);

// The GPU this process runs on: the current CUDA device, which a sharded run sets to its local one
// (replay/run/sharding.h). Every GPU kernel and the GPU reference put their tensors there.
at::Device current_gpu();

}  // namespace attnreplay
