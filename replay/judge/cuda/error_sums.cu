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

namespace attnreplay {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;
static_assert(sizeof(ErrorSums) % sizeof(unsigned long long) == 0, "shuffled as 64-bit words");

// Chan et al.'s merge of two Welford (mean, M2) pairs over na and nb elements.
__host__ __device__ inline void merge_moments(double& mean, double& m2, double other_mean, double other_m2, double na,
                                              double nb) {
  const double n = na + nb;
  if (nb == 0) return;
  if (na == 0) {
    mean = other_mean, m2 = other_m2;
    return;
  }
  const double delta = other_mean - mean;
  mean += delta * (nb / n);
  m2 += other_m2 + delta * delta * (na * nb / n);
}

// `b` folded into `a`; either may be empty.
__host__ __device__ inline void merge(ErrorSums& a, const ErrorSums& b) {
  const double na = static_cast<double>(a.finite), nb = static_cast<double>(b.finite);
  if (b.finite > 0) {
    if (a.finite == 0) {
      a.o_min = b.o_min, a.o_max = b.o_max, a.r_min = b.r_min, a.r_max = b.r_max;
    } else {
      a.o_min = fmin(a.o_min, b.o_min), a.o_max = fmax(a.o_max, b.o_max);
      a.r_min = fmin(a.r_min, b.r_min), a.r_max = fmax(a.r_max, b.r_max);
    }
    if (b.max_abs > a.max_abs || (b.max_abs == a.max_abs && b.worst_index < a.worst_index)) {
      a.max_abs = b.max_abs, a.worst_index = b.worst_index;
    }
    a.max_rel = fmax(a.max_rel, b.max_rel);
  }
  merge_moments(a.e_mean, a.e_m2, b.e_mean, b.e_m2, na, nb);
  merge_moments(a.o_mean, a.o_m2, b.o_mean, b.o_m2, na, nb);
  merge_moments(a.r_mean, a.r_m2, b.r_mean, b.r_m2, na, nb);
  a.finite += b.finite, a.nan += b.nan, a.inf += b.inf, a.beyond_tolerance += b.beyond_tolerance;
  a.reference_nonfinite += b.reference_nonfinite;
  a.sum_e2 += b.sum_e2, a.sum_abs_r += b.sum_abs_r, a.sum_r2 += b.sum_r2, a.sum_o2 += b.sum_o2, a.sum_or += b.sum_or;
  if (b.seen_finite > 0) a.seen_max_abs = a.seen_finite > 0 ? fmax(a.seen_max_abs, b.seen_max_abs) : b.seen_max_abs;
  a.seen_finite += b.seen_finite, a.seen_nan += b.seen_nan, a.seen_inf += b.seen_inf;
  a.seen_sum_e += b.seen_sum_e, a.seen_sum_e2 += b.seen_sum_e2, a.seen_sum_r2 += b.seen_sum_r2;
  a.seen_sum_o2 += b.seen_sum_o2, a.seen_sum_or += b.seen_sum_or;
}

__device__ inline double load(const void* data, ErrorSumsDType dtype, std::int64_t i) {
  switch (dtype) {
    case ErrorSumsDType::float64: return static_cast<const double*>(data)[i];
    case ErrorSumsDType::float32: return static_cast<double>(static_cast<const float*>(data)[i]);
    case ErrorSumsDType::float16: return static_cast<double>(__half2float(static_cast<const __half*>(data)[i]));
    case ErrorSumsDType::bfloat16:
    default: return static_cast<double>(__bfloat162float(static_cast<const __nv_bfloat16*>(data)[i]));
  }
}

__device__ inline void fold(ErrorSums& s, double o, double r, std::int64_t i, bool seen, double epsilon,
                            double tolerance) {
  if (!isfinite(r)) ++s.reference_nonfinite;
  if (!isfinite(o)) {
    const bool is_nan = isnan(o);
    s.nan += is_nan, s.inf += !is_nan;
    if (seen) s.seen_nan += is_nan, s.seen_inf += !is_nan;
    return;
  }
  const double e = fabs(o - r);
  if (s.finite == 0) s.o_min = s.o_max = o, s.r_min = s.r_max = r;
  ++s.finite;
  // Welford's update, one reciprocal for the three.
  const double inverse = 1.0 / static_cast<double>(s.finite);
  double delta = e - s.e_mean;
  s.e_mean += delta * inverse;
  s.e_m2 += delta * (e - s.e_mean);
  delta = o - s.o_mean;
  s.o_mean += delta * inverse;
  s.o_m2 += delta * (o - s.o_mean);
  delta = r - s.r_mean;
  s.r_mean += delta * inverse;
  s.r_m2 += delta * (r - s.r_mean);
  if (e > s.max_abs) s.max_abs = e, s.worst_index = i;  // ascending i: the first largest stays
  s.sum_e2 += e * e, s.sum_abs_r += fabs(r), s.sum_r2 += r * r, s.sum_o2 += o * o, s.sum_or += o * r;
  s.o_min = fmin(s.o_min, o), s.o_max = fmax(s.o_max, o), s.r_min = fmin(s.r_min, r), s.r_max = fmax(s.r_max, r);
  const double relative = e / (fabs(r) + epsilon);
  s.max_rel = fmax(s.max_rel, relative);
  s.beyond_tolerance += e > tolerance && relative > tolerance;
  if (seen) {
    s.seen_max_abs = s.seen_finite > 0 ? fmax(s.seen_max_abs, e) : e;
    ++s.seen_finite;
    s.seen_sum_e += e, s.seen_sum_e2 += e * e, s.seen_sum_r2 += r * r, s.seen_sum_o2 += o * o, s.seen_sum_or += o * r;
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
    const bool seen = p.no_key != nullptr && p.no_key[i / p.row_width] == 0;
    fold(s, load(p.output, p.output_dtype, i), p.reference[i], i, seen, epsilon, tolerance);
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
