// One pass over a kernel's output and the fp64 reference (error_sums.h). Each thread folds a
// grid-stride share of the elements into an ErrorSums, warps fold theirs by shuffles, each block
// writes one, and the host folds the blocks' in order.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "replay/judge/cuda/error_sums.h"
#include "replay/judge/error_fold.h"

namespace attnreplay {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;
static_assert(sizeof(ErrorSums) % sizeof(unsigned long long) == 0, "shuffled as 64-bit words");

__device__ inline double load(const void* data, ErrorSumsDType dtype, std::int64_t i) {
  switch (dtype) {
    case ErrorSumsDType::float64: return static_cast<const double*>(data)[i];
    case ErrorSumsDType::float32: return static_cast<double>(static_cast<const float*>(data)[i]);
    case ErrorSumsDType::float16: return static_cast<double>(__half2float(static_cast<const __half*>(data)[i]));
    case ErrorSumsDType::bfloat16:
    default: return static_cast<double>(__bfloat162float(static_cast<const __nv_bfloat16*>(data)[i]));
  }
}

__device__ inline ErrorSums shuffle_down(const ErrorSums& s, int offset) {
  constexpr int kWords = sizeof(ErrorSums) / sizeof(unsigned long long);
  unsigned long long words[kWords];
  memcpy(words, &s, sizeof(ErrorSums));
#pragma unroll
  for (int w = 0; w < kWords; ++w) words[w] = __shfl_down_sync(0xffffffffu, words[w], offset);
  ErrorSums other;
  memcpy(&other, words, sizeof(ErrorSums));
  return other;
}

__global__ void __launch_bounds__(kThreads) error_sums_kernel(ErrorSumsProblem p, double epsilon, double tolerance,
                                                              ErrorSums* per_block) {
  ErrorSums s;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kThreads;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < p.elements; i += stride) {
    if (p.skip_rows != nullptr && p.skip_rows[i / p.row_width] != 0) continue;
    fold(s, load(p.output, p.output_dtype, i), p.reference[i], i, epsilon, tolerance);
  }
  for (int offset = 16; offset > 0; offset /= 2) merge(s, shuffle_down(s, offset));
  // Raw words: a __shared__ array may not have ErrorSums' initialisers.
  __shared__ unsigned long long warps[kThreads / 32][sizeof(ErrorSums) / sizeof(unsigned long long)];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) memcpy(warps[warp], &s, sizeof(ErrorSums));
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) {
      ErrorSums other;
      memcpy(&other, warps[w], sizeof(ErrorSums));
      merge(s, other);
    }
    per_block[blockIdx.x] = s;
  }
}

}  // namespace

std::size_t error_sums_workspace_bytes() { return sizeof(ErrorSums) * kMaxBlocks; }

const char* error_sums_on_gpu(const ErrorSumsProblem& problem, double relative_epsilon, double tolerance,
                              void* workspace, cudaStream_t stream, ErrorSums& sums) {
  sums = ErrorSums{};
  if (problem.elements <= 0) return nullptr;
  if (problem.row_width <= 0) return "error sums: a row of no elements";
  // Enough blocks to keep every SM's loads in flight; each thread then folds many elements.
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return cudaGetErrorString(cudaGetLastError());
  }
  const std::int64_t wanted = (problem.elements + kThreads * 8 - 1) / (kThreads * 8);
  const int blocks = static_cast<int>(std::min<std::int64_t>({wanted, static_cast<std::int64_t>(sms) * 4, kMaxBlocks}));
  auto* per_block = static_cast<ErrorSums*>(workspace);
  error_sums_kernel<<<blocks, kThreads, 0, stream>>>(problem, relative_epsilon, tolerance, per_block);
  if (cudaPeekAtLastError() != cudaSuccess) return cudaGetErrorString(cudaGetLastError());
  std::vector<ErrorSums> host(static_cast<std::size_t>(blocks));
  if (cudaMemcpyAsync(host.data(), per_block, sizeof(ErrorSums) * host.size(), cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess) {
    return cudaGetErrorString(cudaGetLastError());
  }
  for (const ErrorSums& block : host) merge(sums, block);
  return nullptr;
}

}  // namespace attnreplay
