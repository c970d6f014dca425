// Exact attention in fp64 on CUDA cores, streaming over keys (online softmax, as flash attention
// does, but every value in fp64). The chunked DGEMM path wrote and re-read fp64 score matrices
// several times (150 GB at CogVideoX's shape); this one never stores a score.
//
// A block owns 64 query rows of one (batch, head) and walks the keys in tiles of 64. Each thread
// computes a 4 x 4 tile of scores, and for P.V owns 4 rows x (head_dim_vo / 16) output columns.
// The 16 threads sharing 4 rows are one half-warp, so row maxima and sums reduce by shuffles.
#include <cmath>
#include <limits>

#include "kernels/cuda/reference_fused.h"

namespace attnreplay {
namespace {

constexpr int kRows = 64;     // query rows per block
constexpr int kKeys = 64;     // keys per tile
constexpr int kThreads = 256;
constexpr int kMaxHeadDim = 128;
// K's transposed tile is written every tile: its rows are padded by two doubles so that the
// threads of a warp, writing one channel each, fall in different banks (and reads stay 16-byte
// aligned). Q's tile is written once per block and is left unpadded to fit d = 128.
constexpr int kKeyStride = kKeys + 2;
constexpr int kStaged = kKeys * kMaxHeadDim / kThreads;  // tile elements each thread moves

std::size_t shared_bytes(std::int64_t d, std::int64_t dv) {
  // Q and K transposed (d x 64, d x 66), V (64 x dv), P transposed (64 x 64)
  return sizeof(double) * static_cast<std::size_t>(d * kRows + d * kKeyStride + kKeys * dv + kKeys * kRows);
}

__device__ double half_warp_max(double value) {
  for (int offset = 8; offset > 0; offset /= 2) value = fmax(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

__device__ double half_warp_sum(double value) {
  for (int offset = 8; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// kColumns: output columns per thread (head_dim_vo <= 16 * kColumns).
template <int kColumns>
__global__ void __launch_bounds__(kThreads) fused_reference_kernel(FusedReferenceProblem p) {
  extern __shared__ double shared[];
  const int d = static_cast<int>(p.head_dim), dv = static_cast<int>(p.head_dim_vo);
  double* q_t = shared;              // [d][kRows]
  double* k_t = q_t + d * kRows;     // [d][kKeyStride]
  double* v_s = k_t + d * kKeyStride;  // [kKeys][dv]
  double* p_t = v_s + kKeys * dv;    // [kKeys][kRows]

  const double neg_inf = __longlong_as_double(static_cast<long long>(0xfff0000000000000ull));  // -inf
  const int tid = threadIdx.x;
  const std::int64_t bh = blockIdx.y;
  const std::int64_t b = bh / p.heads_q, h = bh % p.heads_q;
  const std::int64_t kv_head = b * p.heads_kv + h / (p.heads_q / p.heads_kv);
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * kRows;
  const double* q = p.q + bh * p.rows * d;
  const double* k = p.k + kv_head * p.seq_kv * d;
  const double* v = p.v + kv_head * p.seq_kv * dv;

  for (int i = tid; i < kRows * d; i += kThreads) {
    const int r = i / d, c = i % d;
    q_t[c * kRows + r] = row0 + r < p.rows ? q[(row0 + r) * d + c] : 0.0;
  }
  const int my_rows = (tid / 16) * 4;  // first of this thread's 4 rows
  const int my_keys = (tid % 16) * 4;  // first of its 4 keys in a tile
  const int my_column = tid % 16;      // its output columns: my_column + 16 * j

  std::int64_t position[4];
  bool row_valid[4];
  #pragma unroll
  for (int i = 0; i < 4; ++i) {
    const std::int64_t row = row0 + my_rows + i;
    row_valid[i] = row < p.rows;
    position[i] = row_valid[i] ? p.positions[row] : 0;
  }
  // Keys past the last row's horizon are hidden from every row of the block: skip them.
  std::int64_t key_end = p.seq_kv;
  if (p.causal) {
    const std::int64_t last_row = (row0 + kRows < p.rows ? row0 + kRows : p.rows) - 1;
    const std::int64_t horizon = p.positions[last_row] + p.causal_offset + 1;
    key_end = horizon < key_end ? horizon : key_end;
  }

  double running_max[4], running_sum[4], acc[4][kColumns];
  #pragma unroll
  for (int i = 0; i < 4; ++i) {
    running_max[i] = neg_inf;
    running_sum[i] = 0.0;
    #pragma unroll
    for (int j = 0; j < kColumns; ++j) acc[i][j] = 0.0;
  }

  for (std::int64_t key0 = 0; key0 < key_end; key0 += kKeys) {
    __syncthreads();  // the previous tile's K, V and P are no longer read
    // Every load of a tile is issued before the first store, so that the block waits for memory
    // once per tile rather than once per element.
    double staged[kStaged];
#pragma unroll
    for (int n = 0; n < kStaged; ++n) {
      const int i = tid + n * kThreads;
      staged[n] = i < kKeys * d && key0 + i / d < p.seq_kv ? k[key0 * d + i] : 0.0;
    }
#pragma unroll
    for (int n = 0; n < kStaged; ++n) {
      const int i = tid + n * kThreads;
      if (i < kKeys * d) k_t[(i % d) * kKeyStride + i / d] = staged[n];
    }
#pragma unroll
    for (int n = 0; n < kStaged; ++n) {
      const int i = tid + n * kThreads;
      staged[n] = i < kKeys * dv && key0 + i / dv < p.seq_kv ? v[key0 * dv + i] : 0.0;
    }
#pragma unroll
    for (int n = 0; n < kStaged; ++n) {
      const int i = tid + n * kThreads;
      if (i < kKeys * dv) v_s[i] = staged[n];
    }
    __syncthreads();

    double score[4][4] = {};
#pragma unroll 4
    for (int c = 0; c < d; ++c) {
      const double2 qa = *reinterpret_cast<const double2*>(&q_t[c * kRows + my_rows]);
      const double2 qb = *reinterpret_cast<const double2*>(&q_t[c * kRows + my_rows + 2]);
      const double2 ka = *reinterpret_cast<const double2*>(&k_t[c * kKeyStride + my_keys]);
      const double2 kb = *reinterpret_cast<const double2*>(&k_t[c * kKeyStride + my_keys + 2]);
      const double qs[4] = {qa.x, qa.y, qb.x, qb.y}, ks[4] = {ka.x, ka.y, kb.x, kb.y};
      #pragma unroll
      for (int i = 0; i < 4; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j) score[i][j] = fma(qs[i], ks[j], score[i][j]);
    }

    #pragma unroll

    for (int i = 0; i < 4; ++i) {
      double tile_max = neg_inf;
      #pragma unroll
      for (int j = 0; j < 4; ++j) {
        const std::int64_t key = key0 + my_keys + j;
        const bool visible = row_valid[i] && key < p.seq_kv && (!p.causal || key <= position[i] + p.causal_offset);
        score[i][j] = visible ? score[i][j] * p.scale : neg_inf;
        tile_max = fmax(tile_max, score[i][j]);
      }
      const double new_max = fmax(running_max[i], half_warp_max(tile_max));
      // While every key so far is hidden the row has nothing to rescale (and -inf - -inf is NaN).
      const double rescale = new_max == neg_inf ? 1.0 : exp(running_max[i] - new_max);
      double tile_sum = 0.0;
      #pragma unroll
      for (int j = 0; j < 4; ++j) {
        const double weight = score[i][j] == neg_inf ? 0.0 : exp(score[i][j] - new_max);
        tile_sum += weight;
        p_t[(my_keys + j) * kRows + my_rows + i] = weight;
      }
      running_sum[i] = running_sum[i] * rescale + half_warp_sum(tile_sum);
      running_max[i] = new_max;
      #pragma unroll
      for (int j = 0; j < kColumns; ++j) acc[i][j] *= rescale;
    }
    __syncthreads();

    const int keys_here = key_end - key0 < kKeys ? static_cast<int>(key_end - key0) : kKeys;
#pragma unroll 4
    for (int j = 0; j < keys_here; ++j) {
      const double2 pa = *reinterpret_cast<const double2*>(&p_t[j * kRows + my_rows]);
      const double2 pb = *reinterpret_cast<const double2*>(&p_t[j * kRows + my_rows + 2]);
      const double ps[4] = {pa.x, pa.y, pb.x, pb.y};
      #pragma unroll
      for (int c = 0; c < kColumns; ++c) {
        const int column = my_column + 16 * c;
        const double value = column < dv ? v_s[j * dv + column] : 0.0;
        #pragma unroll
        for (int i = 0; i < 4; ++i) acc[i][c] = fma(ps[i], value, acc[i][c]);
      }
    }
  }

  #pragma unroll

  for (int i = 0; i < 4; ++i) {
    if (!row_valid[i]) continue;
    const std::int64_t row = row0 + my_rows + i;
    // A row with no visible key gives 0, as the CPU reference (and torch's math backend) does.
    const bool empty = running_sum[i] == 0.0;
    if (empty && my_column == 0 && p.fully_masked_rows) atomicAdd(p.fully_masked_rows, 1ull);
    #pragma unroll
    for (int c = 0; c < kColumns; ++c) {
      const int column = my_column + 16 * c;
      if (column < dv) p.out[(bh * p.rows + row) * dv + column] = empty ? 0.0 : acc[i][c] / running_sum[i];
    }
  }
}

template <int kColumns>
const char* launch(const FusedReferenceProblem& problem, cudaStream_t stream) {
  const std::size_t bytes = shared_bytes(problem.head_dim, problem.head_dim_vo);
  if (cudaFuncSetAttribute(fused_reference_kernel<kColumns>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes)) != cudaSuccess) {
    return "reference_fused.cu: cudaFuncSetAttribute(MaxDynamicSharedMemorySize) failed";
  }
  const dim3 grid(static_cast<unsigned>((problem.rows + kRows - 1) / kRows),
                  static_cast<unsigned>(problem.batch * problem.heads_q));
  fused_reference_kernel<kColumns><<<grid, kThreads, bytes, stream>>>(problem);
  return cudaGetLastError() == cudaSuccess ? nullptr : "reference_fused.cu: kernel launch failed";
}

}  // namespace

bool fused_reference_supports(std::int64_t head_dim, std::int64_t head_dim_vo) {
  // Tiles are read as pairs of doubles, and must fit the 227 KB of shared memory a block can have.
  return head_dim >= 1 && head_dim <= kMaxHeadDim && head_dim_vo >= 1 && head_dim_vo <= kMaxHeadDim &&
         shared_bytes(head_dim, head_dim_vo) <= 227 * 1024;
}

const char* launch_fused_reference(const FusedReferenceProblem& problem, cudaStream_t stream) {
  if (!fused_reference_supports(problem.head_dim, problem.head_dim_vo)) return "head dims beyond the fused path";
  if (problem.rows == 0 || problem.batch * problem.heads_q == 0) return nullptr;
  if (problem.batch * problem.heads_q > 65535) return "more than 65535 (batch x head) pairs for one launch";
  if (problem.head_dim_vo <= 32) return launch<2>(problem, stream);
  if (problem.head_dim_vo <= 64) return launch<4>(problem, stream);
  return launch<8>(problem, stream);
}

}  // namespace attnreplay
