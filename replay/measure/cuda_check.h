#pragma once
// Every CUDA runtime call in replay/ is checked, and its error names the file, the line and the
// call, as nvbench's cuda_call.cuh does. C++17-clean: replay/measure/cuda_clock.cu includes it.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace attnreplay::cuda_check_detail {

inline void check(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  // Clears a non-sticky error, so that the next checked call does not report this one again.
  cudaGetLastError();
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + call + " failed: " +
                           cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
}

}  // namespace attnreplay::cuda_check_detail

#define ATTNREPLAY_CUDA_CHECK(call) ::attnreplay::cuda_check_detail::check((call), #call, __FILE__, __LINE__)
