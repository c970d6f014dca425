#pragma once
// Input preparation on the GPU (docs/quantized.md, steps 1 and 2 and the FP8 conversions) as one
// persistent kernel: layout change, K's channel means, INT8 codes of Q and K with a scale per
// group, FP8 Q/K/V with their scales. The steps and their order are a PreparationPlan
// (preparation_plan.h). Internal to kernels/cuda.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_attention.h"
#include "kernels/cuda/preparation_plan.h"

namespace attnreplay::cuda_attention {

// One of Q, K, V as uploaded: 16-bit elements, channels contiguous, the rest by strides.
struct InputView {
  const void* data = nullptr;
  std::int64_t stride_b = 0;  // in elements
  std::int64_t stride_h = 0;
  std::int64_t stride_s = 0;
  int batch = 0;
  int heads = 0;
  std::int64_t seq = 0;
  int head_dim = 0;
  Element element = Element::bf16;
};

// One input and what its steps make of it.
struct PreparedInput {
  InputView in;
  // copy: (heads, seq, dim) 16-bit; int8_block / fp8_rows_block: (heads, rows, dim) codes with
  // rows >= seq zero; fp8_values_block: (heads, dim, rows) codes, each 32 keys permuted to the order
  // of the attention kernel's P fragment.
  void* out = nullptr;
  std::int64_t rows = 0;
  int block_rows = 0;  // rows a main step (64 or 128)
  // int8: one a group, `groups` a head; fp8: one a head, or a (head, channel) for V per channel.
  float* scales = nullptr;
  std::int64_t groups = 0;
  // int8
  int groups_per_block = 1;  // int8_groups_per_block
  bool is_key = false;
  Granularity granularity = Granularity::per_warp;
  float pre_scale = 1.0f;  // Q: x = Q * pre_scale
  float* mean = nullptr;   // K: x = K - mean (null: not smoothed); channel_mean steps write it
  // fp8: max |x| as float bits (non-negative floats order as unsigned ints), zeroed before the
  // kernel; one a head, a (head, channel) when per_channel, or one for all when per_tensor.
  unsigned* amax = nullptr;
  bool per_channel = false;
  bool per_tensor = false;
  float fp8_target = 448.0f;  // scale = amax / target
};

struct PreparationArgs {
  PreparedInput inputs[3];
  const Step* steps = nullptr;
  std::uint32_t step_count = 0;
  unsigned* counters = nullptr;  // PreparationPlan::counters of them, zeroed before the kernel
};

// Scale groups in one 64-row (Q) or 128-key (K) block.
int int8_groups_per_block(bool is_key, Granularity granularity);

// CTAs of the kernel for inputs of this element type and head dim: as many as the device holds at
// once, at most `ctas_per_sm` a multiprocessor.
int preparation_grid(Element element, int head_dim, int ctas_per_sm);
// Queues the kernel on `stream`; the counters and maxima must be zero.
void run_preparation(const PreparationArgs& args, Element element, int head_dim, int grid, cudaStream_t stream);

}  // namespace attnreplay::cuda_attention
