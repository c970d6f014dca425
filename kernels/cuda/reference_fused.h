#pragma once
// The GPU reference's fused path: one pass over the keys per tile of query rows, every product,
// exponential and sum in fp64, no score matrix in memory. C++17 and CUDA-runtime only, so that
// both the .cu file and the torch-side caller include it.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace attnreplay {

struct FusedReferenceProblem {
  const double* q = nullptr;  // (batch, heads_q, rows, head_dim), contiguous: the chosen rows only
  const double* k = nullptr;  // (batch, heads_kv, seq_kv, head_dim), contiguous
  const double* v = nullptr;  // (batch, heads_kv, seq_kv, head_dim_vo), contiguous
  double* out = nullptr;      // (batch, heads_q, rows, head_dim_vo)
  const std::int64_t* positions = nullptr;  // query position of each row, ascending (for causal)
  std::int64_t batch = 0, heads_q = 0, heads_kv = 0, rows = 0, seq_kv = 0, head_dim = 0, head_dim_vo = 0;
  bool causal = false;
  std::int64_t causal_offset = 0;  // key j is visible to position i when j <= i + offset
  double scale = 1.0;
  unsigned long long* fully_masked_rows = nullptr;  // device counter, incremented per empty row

  // What a call may add to masked, causal attention, in the CPU reference's order: the scaled score
  // is softcapped, then the mask and ALiBi are added, then causality and the window hide keys.
  // An additive fp64 mask, element (b, h, row, key) at the dot of these strides (0 where broadcast);
  // `row` counts the chosen rows, as q and out do.
  const double* mask = nullptr;
  std::int64_t mask_strides[4] = {0, 0, 0, 0};
  // Key j is visible to position i when i + offset - window_left <= j <= i + offset + window_right.
  bool window_left_set = false, window_right_set = false;
  std::int64_t window_left = 0, window_right = 0;
  double softcap = 0.0;                  // > 0: score = softcap * tanh(score / softcap)
  const double* alibi_slopes = nullptr;  // (batch, heads_q): score -= slope * |i + offset - j|
  const double* sinks = nullptr;         // (heads_q): a logit in each row's denominator, adding no value

  bool extended() const {
    return mask || window_left_set || window_right_set || softcap > 0 || alibi_slopes || sinks;
  }
};

// Head dims the fused path handles (its tiles live in shared memory); others use the chunked one.
bool fused_reference_supports(std::int64_t head_dim, std::int64_t head_dim_vo);

// Queues the computation on `stream`; returns nullptr, or what failed.
const char* launch_fused_reference(const FusedReferenceProblem& problem, cudaStream_t stream);

}  // namespace attnreplay
