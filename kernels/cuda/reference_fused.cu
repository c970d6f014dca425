// Exact attention in fp64 on the GPU, streaming over keys (online softmax, as flash attention does,
// but every product, exponential and sum in fp64). The chunked DGEMM path wrote and re-read fp64
// score matrices several times (150 GB at CogVideoX's shape); this one never stores a score.
//
// Both products run on the fp64 tensor cores (mma.sync m8n8k4 f64: exact fp64 fused multiply-adds,
// twice the rate of the fp64 CUDA cores). A block owns 64 query rows of one (batch, head), one warp
// 8 of them, and walks the keys in tiles of 64. A thread's share of an 8 x 8 score tile is one row
// and two keys, so a row's maximum and sum reduce over the 4 lanes holding that row. Q stays in
// registers; K, V and each warp's P go through shared memory.
#include <cmath>

#include "kernels/cuda/reference_fused.h"

namespace attnreplay {
namespace {

constexpr int kRows = 64;     // query rows per block: 8 warps x 8 rows
constexpr int kKeys = 64;     // keys per tile: 8 score tiles of 8
constexpr int kThreads = 256;
constexpr int kMaxHeadDim = 128;
// Row strides in doubles, padded so that a fragment's 8 rows x 4 doubles (or 4 rows x 8) spread over
// the banks: mod 16 they are 4 for K and P (read 8 rows x 4) and 8 for V (read 4 rows x 8).
constexpr int kProbStride = kKeys + 4;

__host__ __device__ constexpr int padded_dim(int d) { return (d + 3) / 4 * 4; }      // whole k-steps
__host__ __device__ constexpr int padded_dim_vo(int dv) { return (dv + 7) / 8 * 8; }  // whole n-tiles
__host__ __device__ constexpr int key_stride(int d) { return padded_dim(d) + 4; }
__host__ __device__ constexpr int value_stride(int dv) { return padded_dim_vo(dv) + 8; }

std::size_t shared_bytes(int d, int dv) {
  return sizeof(double) *
         static_cast<std::size_t>(kKeys * key_stride(d) + kKeys * value_stride(dv) + kRows * kProbStride);
}

// D = A (8x4, row) * B (4x8, col) + D. Lane l holds A[l/4][l%4], B[l%4][l/4], D[l/4][2(l%4) + 0,1].
__device__ __forceinline__ void mma_f64(double (&d)[2], double a, double b) {
  asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
               : "+d"(d[0]), "+d"(d[1])
               : "d"(a), "d"(b));
}

// Over the 4 lanes that hold one row of a score tile.
__device__ __forceinline__ double row_max(double value) {
  value = fmax(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmax(value, __shfl_xor_sync(0xffffffffu, value, 2));
}

__device__ __forceinline__ double row_sum(double value) {
  value += __shfl_xor_sync(0xffffffffu, value, 1);
  return value + __shfl_xor_sync(0xffffffffu, value, 2);
}

// Rows key0 .. key0 + kKeys - 1 of a (seq_kv, width) matrix into a shared tile of `padded` columns
// with row pitch `stride`, zero past the matrix. Every load is issued before the first store, so
// that the block waits for memory once per tile rather than once per element.
template <int kStaged>
__device__ __forceinline__ void load_tile(const double* src, std::int64_t key0, std::int64_t seq_kv, int width,
                                          int padded, double* tile, int stride, int tid) {
  double staged[kStaged];
#pragma unroll
  for (int n = 0; n < kStaged; ++n) {
    const int i = tid + n * kThreads, j = i / padded, c = i % padded;
    staged[n] = i < kKeys * padded && c < width && key0 + j < seq_kv ? src[(key0 + j) * width + c] : 0.0;
  }
#pragma unroll
  for (int n = 0; n < kStaged; ++n) {
    const int i = tid + n * kThreads;
    if (i < kKeys * padded) tile[(i / padded) * stride + i % padded] = staged[n];
  }
}

// kSteps: k-steps of Q.Kᵀ (padded head_dim / 4); kValueTiles: n-tiles of P.V (padded head_dim_vo / 8).
template <int kSteps, int kValueTiles>
__global__ void __launch_bounds__(kThreads) fused_reference_kernel(FusedReferenceProblem p) {
  extern __shared__ double shared[];
  const int d = static_cast<int>(p.head_dim), dv = static_cast<int>(p.head_dim_vo);
  const int d_padded = padded_dim(d), dv_padded = padded_dim_vo(dv);
  const int k_stride = key_stride(d), v_stride = value_stride(dv);
  double* k_s = shared;                     // [kKeys][k_stride]
  double* v_s = k_s + kKeys * k_stride;     // [kKeys][v_stride]
  double* p_s = v_s + kKeys * v_stride;     // [kRows][kProbStride]

  const double neg_inf = __longlong_as_double(static_cast<long long>(0xfff0000000000000ull));
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int group = lane / 4, quad = lane % 4;  // fragment row, and column pair
  const std::int64_t bh = blockIdx.y;
  const std::int64_t b = bh / p.heads_q, h = bh % p.heads_q;
  const std::int64_t kv_head = b * p.heads_kv + h / (p.heads_q / p.heads_kv);
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * kRows;
  const double* q = p.q + bh * p.rows * d;
  const double* k = p.k + kv_head * p.seq_kv * d;
  const double* v = p.v + kv_head * p.seq_kv * dv;

  const int my_row = warp * 8 + group;  // within the block
  const std::int64_t row = row0 + my_row;
  const bool row_valid = row < p.rows;
  const std::int64_t position = row_valid ? p.positions[row] : 0;
  double q_frag[kSteps];
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const int c = s * 4 + quad;
    q_frag[s] = row_valid && c < d ? q[row * d + c] : 0.0;
  }
  // Keys past the last row's horizon are hidden from every row of the block: skip them.
  std::int64_t key_end = p.seq_kv;
  if (p.causal) {
    const std::int64_t last_row = (row0 + kRows < p.rows ? row0 + kRows : p.rows) - 1;
    const std::int64_t horizon = p.positions[last_row] + p.causal_offset + 1;
    key_end = horizon < key_end ? horizon : key_end;
  }

  double running_max = neg_inf, running_sum = 0.0;
  double acc[kValueTiles][2];
#pragma unroll
  for (int t = 0; t < kValueTiles; ++t) acc[t][0] = acc[t][1] = 0.0;

  constexpr int kStaged = (kSteps > 2 * kValueTiles ? kSteps : 2 * kValueTiles);  // elements a thread moves
  for (std::int64_t key0 = 0; key0 < key_end; key0 += kKeys) {
    __syncthreads();  // the previous tile's K and V are no longer read
    load_tile<kStaged>(k, key0, p.seq_kv, d, d_padded, k_s, k_stride, tid);
    load_tile<kStaged>(v, key0, p.seq_kv, dv, dv_padded, v_s, v_stride, tid);
    __syncthreads();

    // S = Q Kᵀ for this warp's 8 rows and the tile's 64 keys: 8 score tiles.
    double score[8][2];
#pragma unroll
    for (int t = 0; t < 8; ++t) score[t][0] = score[t][1] = 0.0;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      if (s * 4 < d_padded) {
#pragma unroll
        for (int t = 0; t < 8; ++t) mma_f64(score[t], q_frag[s], k_s[(t * 8 + group) * k_stride + s * 4 + quad]);
      }
    }

    double tile_max = neg_inf;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const std::int64_t key = key0 + t * 8 + quad * 2 + e;
        const bool visible = row_valid && key < p.seq_kv && (!p.causal || key <= position + p.causal_offset);
        score[t][e] = visible ? score[t][e] * p.scale : neg_inf;
        tile_max = fmax(tile_max, score[t][e]);
      }
    }
    const double new_max = fmax(running_max, row_max(tile_max));
    // While every key so far is hidden the row has nothing to rescale (and -inf - -inf is NaN).
    const double rescale = new_max == neg_inf ? 1.0 : exp(running_max - new_max);
    double tile_sum = 0.0;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      double2 weights;
      weights.x = score[t][0] == neg_inf ? 0.0 : exp(score[t][0] - new_max);
      weights.y = score[t][1] == neg_inf ? 0.0 : exp(score[t][1] - new_max);
      tile_sum += weights.x + weights.y;
      *reinterpret_cast<double2*>(&p_s[my_row * kProbStride + t * 8 + quad * 2]) = weights;
    }
    running_sum = running_sum * rescale + row_sum(tile_sum);
    running_max = new_max;
#pragma unroll
    for (int t = 0; t < kValueTiles; ++t) {
      acc[t][0] *= rescale;
      acc[t][1] *= rescale;
    }
    __syncwarp();  // a warp reads back only its own rows of P

    // O += P V: 16 k-steps of 4 keys (hidden or missing keys have weight 0 and a zero V row).
#pragma unroll 4
    for (int s = 0; s < kKeys / 4; ++s) {
      const double a = p_s[my_row * kProbStride + s * 4 + quad];
#pragma unroll
      for (int t = 0; t < kValueTiles; ++t) {
        if (t * 8 < dv_padded) mma_f64(acc[t], a, v_s[(s * 4 + quad) * v_stride + t * 8 + group]);
      }
    }
    __syncwarp();  // P is rewritten by the next tile
  }

  if (!row_valid) return;
  // A row with no visible key gives 0, as the CPU reference (and torch's math backend) does.
  const bool empty = running_sum == 0.0;
  if (empty && quad == 0 && p.fully_masked_rows) atomicAdd(p.fully_masked_rows, 1ull);
#pragma unroll
  for (int t = 0; t < kValueTiles; ++t) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int column = t * 8 + quad * 2 + e;
      if (column < dv) p.out[(bh * p.rows + row) * dv + column] = empty ? 0.0 : acc[t][e] / running_sum;
    }
  }
}

template <int kSteps, int kValueTiles>
const char* launch(const FusedReferenceProblem& problem, cudaStream_t stream) {
  const int d = static_cast<int>(problem.head_dim), dv = static_cast<int>(problem.head_dim_vo);
  const std::size_t bytes = shared_bytes(d, dv);
  if (cudaFuncSetAttribute(fused_reference_kernel<kSteps, kValueTiles>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes)) != cudaSuccess) {
    return "reference_fused.cu: cudaFuncSetAttribute(MaxDynamicSharedMemorySize) failed";
  }
  const dim3 grid(static_cast<unsigned>((problem.rows + kRows - 1) / kRows),
                  static_cast<unsigned>(problem.batch * problem.heads_q));
  fused_reference_kernel<kSteps, kValueTiles><<<grid, kThreads, bytes, stream>>>(problem);
  return cudaGetLastError() == cudaSuccess ? nullptr : "reference_fused.cu: kernel launch failed";
}

}  // namespace

bool fused_reference_supports(std::int64_t head_dim, std::int64_t head_dim_vo) {
  // Tiles must fit the 227 KB of shared memory a block can have.
  return head_dim >= 1 && head_dim <= kMaxHeadDim && head_dim_vo >= 1 && head_dim_vo <= kMaxHeadDim &&
         shared_bytes(static_cast<int>(head_dim), static_cast<int>(head_dim_vo)) <= 227 * 1024;
}

const char* launch_fused_reference(const FusedReferenceProblem& problem, cudaStream_t stream) {
  if (!fused_reference_supports(problem.head_dim, problem.head_dim_vo)) return "head dims beyond the fused path";
  if (problem.rows == 0 || problem.batch * problem.heads_q == 0) return nullptr;
  if (problem.batch * problem.heads_q > 65535) return "more than 65535 (batch x head) pairs for one launch";
  const bool narrow = problem.head_dim <= 64, narrow_vo = problem.head_dim_vo <= 64;
  if (narrow && narrow_vo) return launch<16, 8>(problem, stream);
  if (narrow) return launch<16, 16>(problem, stream);
  if (narrow_vo) return launch<32, 8>(problem, stream);
  return launch<32, 16>(problem, stream);
}

}  // namespace attnreplay
