#pragma once
// The order of the input preparation's steps (kernels/cuda/preparation.h). One persistent kernel
// takes the steps in this order, one CTA a step; this file decides the order. Host code, C++17, so
// that nvcc and the CPU unit tests both read it.
//
// Some steps need a figure over a whole head first: K's channel means, or the max |x| that sets an
// FP8 scale. Those "gather" steps run first and count themselves done on a counter; the steps that
// use the figure wait for the count. Every step waits only on steps listed before it, and CTAs take
// steps in list order, so the wait always ends. A head's main steps come soon after its gather
// steps, so that their second read of the head mostly finds it still in L2.
#include <cstdint>
#include <vector>

namespace attnreplay::cuda_attention {

enum class StepKind : std::uint8_t {
  copy,              // a block of rows to (batch, heads, seq, dim)
  channel_mean,      // 32 channels' means over every key of a head, summed in key order
  int8_block,        // INT8 codes and scales of a block of rows (64 of Q, 128 of K)
  abs_max_block,     // max |x| of a block of 128 rows, into the head's (or tensor's) maximum
  fp8_rows_block,    // e4m3 codes of a block of rows
  fp8_values_block,  // e4m3 codes of 128 keys of V, transposed
};

// One CTA's work: block `block` of head `head` (batch * heads + h) of input `tensor`. Counter 0
// hands out the steps; `wait` (when not 0) names a counter that must reach `wait_count` first, and
// `signal` (when not 0) one that the step adds 1 to when its writes are visible.
struct Step {
  StepKind kind = StepKind::copy;
  std::uint8_t tensor = 0;
  std::uint16_t unused = 0;
  std::uint32_t head = 0;
  std::uint32_t block = 0;
  std::uint32_t wait = 0;
  std::uint32_t wait_count = 0;
  std::uint32_t signal = 0;
};

// What one input's preparation is made of.
struct TensorWork {
  std::uint8_t tensor = 0;
  std::int64_t heads = 0;       // batch * heads
  std::int64_t head_bytes = 0;  // one head as uploaded: spaces gathers and their uses
  // Gather steps a head (0: none), and whether they are long serial sums (channel means) that go
  // before everything, with the main steps after everything else.
  StepKind gather = StepKind::abs_max_block;
  std::int64_t gather_steps = 0;
  bool gather_serial = false;
  // The gathered figure is one for the whole tensor: every head's gathers before any main step.
  bool gather_whole_tensor = false;
  StepKind main = StepKind::copy;
  std::int64_t main_steps = 0;
};

struct PreparationPlan {
  std::vector<Step> steps;
  std::uint32_t counters = 1;  // counter 0 included
};

// Gathers of a head and their uses are at least `reuse_bytes` of input apart (the bytes the
// steps in flight read; less than the L2). Throws std::invalid_argument on impossible work.
PreparationPlan plan_preparation(const std::vector<TensorWork>& tensors, std::int64_t reuse_bytes);

}  // namespace attnreplay::cuda_attention
