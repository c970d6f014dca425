#pragma once
// A kernel's output against the reference on the GPU in one pass: every sum, extreme and count the
// error figures are made of (replay/judge/compare.cpp), read once from each tensor, where torch's
// reductions took about thirty passes and two waits a comparison. C++17 and CUDA-runtime only, so
// that both the .cu file and the torch-side caller include it.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace attnreplay {

enum class ErrorSumsDType { float64, float32, float16, bfloat16 };

struct ErrorSumsProblem {
  const void* output = nullptr;      // contiguous, (b, h, rows, d) in `output_dtype`
  ErrorSumsDType output_dtype = ErrorSumsDType::float32;
  const double* reference = nullptr;  // contiguous fp64, the same shape
  std::int64_t elements = 0;
  std::int64_t row_width = 1;          // d: an element's (b, h, row) slot is its index / d
  const std::uint8_t* no_key = nullptr;  // per slot, 1 where the row sees no key; null when none does
};

// Sums over the elements where the output is finite (Welford's mean and M2 where a spread is wanted,
// as torch's std_mean keeps them), and over those of rows that see a key. Merged block by block in
// a fixed order: the same figures for the same inputs on the same GPU.
struct ErrorSums {
  std::int64_t finite = 0, nan = 0, inf = 0, beyond_tolerance = 0;
  std::int64_t reference_nonfinite = 0;  // the comparison is then torch's, which propagates them
  std::int64_t worst_index = -1;         // the first element of the largest |o - r|
  double max_abs = -1;
  double e_mean = 0, e_m2 = 0, o_mean = 0, o_m2 = 0, r_mean = 0, r_m2 = 0;
  double sum_e2 = 0, sum_abs_r = 0, sum_r2 = 0, sum_o2 = 0, sum_or = 0;
  double o_min = 0, o_max = 0, r_min = 0, r_max = 0, max_rel = 0;
  // The rows that see a key (only where `no_key` is given).
  std::int64_t seen_finite = 0, seen_nan = 0, seen_inf = 0;
  double seen_max_abs = 0, seen_sum_e = 0, seen_sum_e2 = 0, seen_sum_r2 = 0, seen_sum_o2 = 0, seen_sum_or = 0;
};

// Device memory the pass needs for its per-block sums.
std::size_t error_sums_workspace_bytes();

// Queues the pass on `stream`, waits for it and fills `sums`; returns nullptr, or what failed.
// `relative_epsilon` and `tolerance` are FlashInfer-Bench's (compare.cpp).
const char* error_sums_on_gpu(const ErrorSumsProblem& problem, double relative_epsilon, double tolerance,
                              void* workspace, cudaStream_t stream, ErrorSums& sums);

}  // namespace attnreplay
