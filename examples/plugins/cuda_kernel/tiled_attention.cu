// One thread per query row, K and V staged in shared memory a tile of keys at a time, and an
// online softmax in fp32: simple enough to read in a minute, correct for any lengths.
#include <cuda_runtime.h>

#include <cmath>

#include "tiled_attention.h"

namespace {

constexpr int kRows = 64;      // query rows (threads) per block
constexpr int kKeys = 32;      // keys per shared-memory tile
constexpr int kMaxDim = 256;   // head dims up to this

__global__ void tiled_attention(TiledAttentionProblem p) {
  extern __shared__ float tile[];  // kKeys x dim_qk of K, then kKeys x dim_vo of V
  float* k_tile = tile;
  float* v_tile = tile + kKeys * p.dim_qk;
  const std::int64_t bh = blockIdx.y, b = bh / p.heads_q, h = bh % p.heads_q;
  const std::int64_t kv = b * p.heads_kv + h / (p.heads_q / p.heads_kv);
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kRows + threadIdx.x;
  const bool active = row < p.seq_q;
  const float* q = p.q + (bh * p.seq_q + (active ? row : 0)) * p.dim_qk;
  float acc[kMaxDim] = {};
  float row_max = -INFINITY, row_sum = 0;
  for (std::int64_t start = 0; start < p.seq_kv; start += kKeys) {
    const int keys = static_cast<int>(p.seq_kv - start < kKeys ? p.seq_kv - start : kKeys);
    __syncthreads();
    for (std::int64_t i = threadIdx.x; i < keys * p.dim_qk; i += blockDim.x) k_tile[i] = p.k[(kv * p.seq_kv + start) * p.dim_qk + i];
    for (std::int64_t i = threadIdx.x; i < keys * p.dim_vo; i += blockDim.x) v_tile[i] = p.v[(kv * p.seq_kv + start) * p.dim_vo + i];
    __syncthreads();
    if (!active) continue;
    for (int j = 0; j < keys; ++j) {
      if (p.causal && start + j > row + p.causal_shift) break;
      float score = 0;
      for (int d = 0; d < p.dim_qk; ++d) score += q[d] * k_tile[j * p.dim_qk + d];
      score *= p.scale;
      const float new_max = fmaxf(row_max, score);
      const float correction = expf(row_max - new_max), weight = expf(score - new_max);
      row_sum = row_sum * correction + weight;
      for (int d = 0; d < p.dim_vo; ++d) acc[d] = acc[d] * correction + weight * v_tile[j * p.dim_vo + d];
      row_max = new_max;
    }
  }
  if (!active) return;
  float* out = p.out + (bh * p.seq_q + row) * p.dim_vo;
  for (int d = 0; d < p.dim_vo; ++d) out[d] = row_sum > 0 ? acc[d] / row_sum : 0.0f;  // no key seen: 0
}

}  // namespace

std::string launch_tiled_attention(const TiledAttentionProblem& problem) {
  if (problem.dim_qk > kMaxDim || problem.dim_vo > kMaxDim) return "head dims above 256";
  const dim3 grid(static_cast<unsigned>((problem.seq_q + kRows - 1) / kRows),
                  static_cast<unsigned>(problem.batch * problem.heads_q));
  const size_t shared = sizeof(float) * kKeys * (problem.dim_qk + problem.dim_vo);
  tiled_attention<<<grid, kRows, shared>>>(problem);
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? std::string() : cudaGetErrorString(error);
}

std::string cuda_device_problem() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(error);
  return count > 0 ? std::string() : "no CUDA device";
}
