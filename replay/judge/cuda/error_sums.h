#pragma once
// A kernel's output against the reference on the GPU in one pass: every sum, extreme and count the
// error figures are made of (replay/judge/compare.cpp), read once from each tensor, where torch's
// reductions took about thirty passes and two waits a comparison. C++17 and CUDA-runtime only, so
// that both the .cu file and the torch-side caller include it.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "replay/judge/error_fold.h"

namespace attnreplay {

struct ErrorSumsProblem {
  const void* output = nullptr;      // contiguous, (b, h, rows, d) in `output_dtype`
  ErrorSumsDType output_dtype = ErrorSumsDType::float32;
  const double* reference = nullptr;  // contiguous fp64, the same shape
  std::int64_t elements = 0;
  std::int64_t row_width = 1;          // d: an element's (b, h, row) slot is its index / d
  // Per slot, 1 where the row is left out (it sees no key); null: every row is folded.
  const std::uint8_t* skip_rows = nullptr;
};

// Device memory the pass needs for its per-block sums.
std::size_t error_sums_workspace_bytes();

// Queues the pass on `stream`, waits for it and fills `sums`; returns nullptr, or what failed.
// `relative_epsilon` and `tolerance` are FlashInfer-Bench's (compare.cpp).
const char* error_sums_on_gpu(const ErrorSumsProblem& problem, double relative_epsilon, double tolerance,
                              void* workspace, cudaStream_t stream, ErrorSums& sums);

}  // namespace attnreplay
