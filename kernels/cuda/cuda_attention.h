#pragma once
// The CUDA side of attnreplay's own attention kernels (flash, sage1-int8, sage2-int8-fp8, fa3-fp8;
// docs/quantized.md) behind a C++17 interface, so that nvcc never sees the project's C++20
// headers. kernels/cuda_attention_kernel.cpp builds the registered Kernels on it.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "formats/attention_shape.h"
#include "kernels/quant_options.h"

namespace attnreplay::cuda_attention {

enum class Element { bf16, fp16 };

struct Problem {
  // Head dims multiples of 8 up to 128, Q's and K's and V's (the output's) apart: the kernels run 64
  // or 128, and take others by padding the inputs' channels with zeros in the preparation.
  AttentionShape shape;
  Element element = Element::bf16;
  bool bshd = false;  // Q, K, V are (batch, seq, heads, dim); otherwise (batch, heads, seq, dim)
  // The query heads of each KV head packed as the rows of one (kernels/quantized_attention.h,
  // packed_query_heads): `shape` is the packed one, and Q and the output are (batch, heads_kv,
  // rows, dim) rows without gaps, whatever K's and V's layout.
  bool packed_query_heads = false;
  // Whether its keys may be split across CTAs where it alone would leave the GPU idle
  // (key_split_count); not for a batch's sequences, which AttentionTogether runs.
  bool split_keys = true;
  bool causal = false;
  // Key j is visible to row i when j <= i + causal_offset: s_kv - s_q bottom-right, 0 top-left, any
  // other where a padded call's batch entry was cut to its keys (kernels/per_sequence.h).
  std::int64_t causal_offset = 0;
  double scale = 0;           // softmax scale
};

// Empty when the current CUDA device can run the kernels (every kind needs the same); otherwise why
// not (no device, not a Hopper GPU, or no code in this build for the device's architecture).
std::string device_unsupported_reason();
// Empty when the kernels take `problem` (head dim, sizes); otherwise why not.
std::string problem_unsupported_reason(const Problem& problem);

// Where work buffers come from when not from cudaMalloc: a caching allocator whose memory a stream
// may reuse as soon as the work queued on it is done (torch's, under kernel substitution), so that
// a call allocates and frees without waiting for the device.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void release(void* pointer) = 0;
};

// A call's inputs where a model has them, contiguous in the problem's layout, and where its output
// goes, (batch, heads_q, seq_q, head_dim_vo): all on the current device, none owned by the kernel.
struct ResidentInputs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
};

// One call on the GPU: inputs uploaded once, prepared (layout change, K smoothing, quantization)
// on the GPU, attention run as often as asked. Work is queued on the stream given (by default the
// legacy default stream).
class Attention {
 public:
  // q, k, v: the call's host bytes in its layout (contiguous). Uploads, prepares once and waits.
  Attention(QuantizedKind kind, const Problem& problem, const QuantOptions& options, const void* q, const void* k,
            const void* v);
  // The inputs where they are: nothing uploaded, work buffers from `memory`, the preparation queued
  // on `stream` and not waited for. run(stream) then writes the output; the buffers may go (this
  // destroyed) as soon as that is queued, where `memory` orders reuse after the stream's work.
  Attention(QuantizedKind kind, const Problem& problem, const QuantOptions& options, const ResidentInputs& inputs,
            DeviceMemory& memory, cudaStream_t stream);
  ~Attention();
  Attention(const Attention&) = delete;
  Attention& operator=(const Attention&) = delete;

  // Whether prepare_inputs() does any work (it does not for flash on bhsd inputs of head dim 64 or 128).
  bool has_preparation() const;
  // Redoes the input preparation from the uploaded inputs.
  void prepare_inputs(cudaStream_t stream = nullptr);
  // The least the preparation must move: each input it prepares read once (K twice when smoothed,
  // once for its channel means), and what the attention reads written once, scales included.
  std::size_t preparation_bytes() const;
  // Queues the attention alone. Right after prepare_inputs() it overlaps the preparation's last
  // kernel (programmatic dependent launch); otherwise it waits for all work before it.
  void run(cudaStream_t stream = nullptr);
  // Waits for queued work; reports a kernel fault with the place it was noticed.
  void synchronize();
  // The output (batch, heads_q, seq_q, head_dim_vo) in the input element type: `bytes` must be its size.
  void download_output(void* host, std::size_t bytes);
  // The same output where it is, on the device, valid while this lives.
  const void* device_output() const;

 private:
  friend class AttentionTogether;
  void set_up(QuantizedKind kind, const QuantOptions& options, DeviceMemory* memory, cudaStream_t stream);
  struct State;
  std::unique_ptr<State> state_;
};

// Several prepared calls of batch 1 (a padded batch's entries, a ragged batch's sequences:
// kernels/per_sequence.h) whose attention runs in one launch, each call's CTAs on a grid z of their
// own and each output where the call's own run() writes it. One kind, element type, head dims,
// heads and options; lengths and causality their own.
class AttentionTogether {
 public:
  // Makes the calls' kernel parameters and uploads them (and waits); the calls must outlive this.
  explicit AttentionTogether(const std::vector<Attention*>& calls);
  ~AttentionTogether();
  AttentionTogether(const AttentionTogether&) = delete;
  AttentionTogether& operator=(const AttentionTogether&) = delete;
  // Queues the launch after all work before it on `stream` (the calls' preparations among it).
  void run(cudaStream_t stream = nullptr);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace attnreplay::cuda_attention
