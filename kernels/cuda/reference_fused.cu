// Exact attention in fp64 on the GPU, streaming over keys (online softmax, as flash attention does,
// but every product, exponential and sum in fp64). The chunked DGEMM path wrote and re-read fp64
// score matrices several times (150 GB at CogVideoX's shape); this one never stores a score.
//
// Both products run on the fp64 tensor cores as mma.sync m16n8k4 (exact fp64 fused multiply-adds).
// On Hopper that shape runs at the full fp64 tensor rate, twice m8n8k4's (66 against 33 TFLOP/s on
// an H200, bench/results/2026-11-28-h200-reference-kernel/). Each product is taken transposed, so
// that a warp's 8 query rows are the n = 8 side: Sᵀ = K Qᵀ (16 keys x 8 rows a tile, Q in
// registers) and Oᵀ = Vᵀ Pᵀ (16 output columns x 8 rows). A block owns 64 query rows of one
// (batch, head) and walks the keys in tiles of 64; K, V and each warp's P go through shared memory.
// K and V are copied in asynchronously (cp.async), each while the other is being used, so that
// the block does not wait for memory between tiles.
//
// A mask, a window, a softcap, ALiBi or sinks take a second instance of the kernel (kExtended), so
// that plain calls keep the registers and the instructions they need and no more. A mask's tile is
// copied in beside V and waited for before the scores need it: read score by score from global
// memory it cost Flux's masked call 17 ms where it now costs 12 (8.7 without a mask; H200).
#include <cmath>

#include "kernels/cuda/reference_fused.h"

namespace attnreplay {
namespace {

constexpr int kRows = 64;  // query rows per block: 8 warps x 8 rows
constexpr int kKeys = 64;  // keys per tile: 4 score tiles of 16
constexpr int kThreads = 256;
constexpr int kMaxHeadDim = 128;
// Row pitches in doubles: 4 more than a multiple of 16, so that the 16 lanes of a half-warp, which
// read rows g = 0..3 at columns t = 0..3 (or the transpose), hit 16 different bank pairs.
__host__ __device__ constexpr int pitch(int width) { return width + 4; }
constexpr int kProbPitch = pitch(kKeys);

// K, V, P and, for an extended call, the mask's tile (laid out as P).
template <int kWidthQk, int kWidthVo, bool kExtended>
constexpr std::size_t shared_bytes() {
  return sizeof(double) * static_cast<std::size_t>(kKeys * pitch(kWidthQk) + kKeys * pitch(kWidthVo) +
                                                   (kExtended ? 2 : 1) * kRows * kProbPitch);
}

// D (16x8) += A (16x4, row) * B (4x8, col). With g = lane / 4 and t = lane % 4, a lane holds
// A[g][t] and A[g + 8][t], B[t][g], and D[g][2t + 0,1], D[g + 8][2t + 0,1].
__device__ __forceinline__ void mma_f64(double (&d)[4], double a0, double a1, double b) {
  asm volatile("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
               : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
               : "d"(a0), "d"(a1), "d"(b));
}

// Over the 8 lanes that hold the same query rows (the same t, every g).
__device__ __forceinline__ double across_keys_max(double value) {
  value = fmax(value, __shfl_xor_sync(0xffffffffu, value, 4));
  value = fmax(value, __shfl_xor_sync(0xffffffffu, value, 8));
  return fmax(value, __shfl_xor_sync(0xffffffffu, value, 16));
}

__device__ __forceinline__ double across_keys_sum(double value) {
  value += __shfl_xor_sync(0xffffffffu, value, 4);
  value += __shfl_xor_sync(0xffffffffu, value, 8);
  return value + __shfl_xor_sync(0xffffffffu, value, 16);
}

// Queues the copy of rows key0 .. key0 + kKeys - 1 of a (seq_kv, width) matrix into a shared tile
// kWidth columns wide; what lies past the matrix is filled with zeros (a zero-byte source). A thread
// copies one column, every kThreads / kWidth-th row, so that its addresses are a base and a stride.
template <int kWidth>
__device__ __forceinline__ void copy_tile_async(const double* src, std::int64_t key0, std::int64_t seq_kv, int width,
                                                double* tile, int tid) {
  constexpr int kRowStep = kThreads / kWidth;
  const int c = tid % kWidth, j0 = tid / kWidth;
  const double* from = src + (key0 + j0) * width + c;
  unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(tile + j0 * pitch(kWidth) + c));
  const std::int64_t rows_left = seq_kv - key0 - j0;  // rows of the matrix from this thread's first one on
#pragma unroll 8
  for (int j = 0; j < kKeys; j += kRowStep) {
    const bool inside = c < width && j < rows_left;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(to), "l"(inside ? from : src), "r"(inside ? 8 : 0)
                 : "memory");
    from += kRowStep * width;
    to += kRowStep * pitch(kWidth) * sizeof(double);
  }
  asm volatile("cp.async.commit_group;\n" ::);
}

// Queues the copy of the mask's kRows x kKeys tile at (row0, key0) of (b, h), laid out as P; what
// lies past the rows or keys is filled with zeros (those scores are hidden). A thread copies one
// key column, every kThreads / kKeys-th row.
__device__ __forceinline__ void copy_mask_tile_async(const FusedReferenceProblem& p, std::int64_t b, std::int64_t h,
                                                     std::int64_t row0, std::int64_t key0, double* tile, int tid) {
  constexpr int kRowStep = kThreads / kKeys;
  const int c = tid % kKeys, r0 = tid / kKeys;
  const std::int64_t key = key0 + c;
  const double* base = p.mask + b * p.mask_strides[0] + h * p.mask_strides[1] + key * p.mask_strides[3];
  unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(tile + r0 * kProbPitch + c));
#pragma unroll 4
  for (int r = r0; r < kRows; r += kRowStep) {
    const bool inside = row0 + r < p.rows && key < p.seq_kv;
    const double* from = inside ? base + (row0 + r) * p.mask_strides[2] : p.mask;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(to), "l"(from), "r"(inside ? 8 : 0) : "memory");
    to += kRowStep * kProbPitch * sizeof(double);
  }
  asm volatile("cp.async.commit_group;\n" ::);
}

template <int kPending>
__device__ __forceinline__ void wait_for_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// kWidthQk, kWidthVo: the head dims rounded up to the shared tiles' widths (64 or 128).
// kExtended: the call has a mask, window, softcap, ALiBi or sinks.
template <int kWidthQk, int kWidthVo, bool kExtended>
__global__ void __launch_bounds__(kThreads) fused_reference_kernel(FusedReferenceProblem p) {
  constexpr int kSteps = kWidthQk / 4;          // k-steps of K Qᵀ
  constexpr int kValueTiles = kWidthVo / 16;    // 16-column tiles of Oᵀ
  constexpr int kScoreTiles = kKeys / 16;
  extern __shared__ double shared[];
  const int d = static_cast<int>(p.head_dim), dv = static_cast<int>(p.head_dim_vo);
  double* k_s = shared;                           // [kKeys][pitch(kWidthQk)]
  double* v_s = k_s + kKeys * pitch(kWidthQk);    // [kKeys][pitch(kWidthVo)]
  double* p_s = v_s + kKeys * pitch(kWidthVo);    // [kRows][kProbPitch]
  double* mask_s = p_s + kRows * kProbPitch;      // [kRows][kProbPitch], extended calls only

  const double neg_inf = __longlong_as_double(static_cast<long long>(0xfff0000000000000ull));
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const std::int64_t bh = blockIdx.y;
  const std::int64_t b = bh / p.heads_q, h = bh % p.heads_q;
  const std::int64_t kv_head = b * p.heads_kv + h / (p.heads_q / p.heads_kv);
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * kRows;
  const std::int64_t last_row = (row0 + kRows < p.rows ? row0 + kRows : p.rows) - 1;
  const double* q = p.q + bh * p.rows * d;
  const double* k = p.k + kv_head * p.seq_kv * d;
  const double* v = p.v + kv_head * p.seq_kv * dv;

  // As Qᵀ's fragment the lane holds row g of the warp's 8; as a score's and the output's, rows 2t
  // and 2t + 1.
  const std::int64_t warp_row0 = row0 + warp * 8;
  double q_frag[kSteps];
  {
    const std::int64_t row = warp_row0 + g;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int c = s * 4 + t;
      q_frag[s] = row < p.rows && c < d ? q[row * d + c] : 0.0;
    }
  }
  // The keys a row at `position` may see by causality and the window: first .. end - 1.
  auto first_key = [&](std::int64_t position) -> std::int64_t {
    if (!kExtended || !p.window_left_set) return 0;
    const std::int64_t first = position + p.causal_offset - p.window_left;
    return first > 0 ? first : 0;
  };
  auto end_key = [&](std::int64_t position) -> std::int64_t {
    std::int64_t end = p.seq_kv;
    if (p.causal && position + p.causal_offset + 1 < end) end = position + p.causal_offset + 1;
    if (kExtended && p.window_right_set && position + p.causal_offset + p.window_right + 1 < end) {
      end = position + p.causal_offset + p.window_right + 1;
    }
    return end;
  };
  bool row_valid[2];
  std::int64_t seen_first[2], seen_end[2];
  std::int64_t diagonal[2];  // where the row's diagonal sits among the keys (for ALiBi)
  for (int e = 0; e < 2; ++e) {
    const std::int64_t row = warp_row0 + 2 * t + e;
    row_valid[e] = row < p.rows;
    const std::int64_t position = row_valid[e] ? p.positions[row] : 0;
    seen_first[e] = first_key(position);
    seen_end[e] = end_key(position);
    diagonal[e] = position + p.causal_offset;
  }
  const bool masked = kExtended && p.mask;
  // Positions ascend, so a window's bounds do too: keys outside [the first row's first, the last
  // row's end) are hidden from every row of the block and skipped; inside [the last row's first,
  // the first row's end) a tile hides nothing and needs no test per score.
  const std::int64_t key_begin = first_key(p.positions[row0]), key_end = end_key(p.positions[last_row]);
  const std::int64_t open_begin = first_key(p.positions[last_row]);
  std::int64_t open_end = end_key(p.positions[row0]);
  if (last_row - row0 + 1 < kRows) open_end = 0;  // a block with missing rows tests every score
  const double slope = kExtended && p.alibi_slopes ? p.alibi_slopes[bh] : 0.0;

  double running_max[2] = {neg_inf, neg_inf}, running_sum[2] = {0.0, 0.0};  // the sum: this lane's keys only
  double acc[kValueTiles][4];
#pragma unroll
  for (int w = 0; w < kValueTiles; ++w) acc[w][0] = acc[w][1] = acc[w][2] = acc[w][3] = 0.0;

  if (key_begin < key_end) copy_tile_async<kWidthQk>(k, key_begin, p.seq_kv, d, k_s, tid);
  for (std::int64_t key0 = key_begin; key0 < key_end; key0 += kKeys) {
    wait_for_copies<0>();  // this tile's K
    __syncthreads();       // ... seen by every thread; and every warp is done with the last tile's V
    if (masked) copy_mask_tile_async(p, b, h, row0, key0, mask_s, tid);  // before V: it is needed first
    copy_tile_async<kWidthVo>(v, key0, p.seq_kv, dv, v_s, tid);

    // Sᵀ = K Qᵀ: score[u] is keys key0 + 16u + (g, g + 8) by rows 2t, 2t + 1.
    double score[kScoreTiles][4];
#pragma unroll
    for (int u = 0; u < kScoreTiles; ++u) score[u][0] = score[u][1] = score[u][2] = score[u][3] = 0.0;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      if (s * 4 < d) {
#pragma unroll
        for (int u = 0; u < kScoreTiles; ++u) {
          const double* key_row = k_s + (u * 16 + g) * pitch(kWidthQk) + s * 4 + t;
          mma_f64(score[u], key_row[0], key_row[8 * pitch(kWidthQk)], q_frag[s]);
        }
      }
    }
    if (masked) wait_for_copies<1>();  // this tile's mask (V may still be coming)
    __syncthreads();  // every warp is done with this tile's K: the next one can come in (and the mask is seen)
    if (key0 + kKeys < key_end) {
      copy_tile_async<kWidthQk>(k, key0 + kKeys, p.seq_kv, d, k_s, tid);
    } else {
      asm volatile("cp.async.commit_group;\n" ::);  // an empty group keeps the count of pending ones
    }

    const bool test_each = key0 < open_begin || key0 + kKeys > open_end;
    double tile_max[2] = {neg_inf, neg_inf};
#pragma unroll
    for (int u = 0; u < kScoreTiles; ++u) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int e = i % 2;
        const std::int64_t key = key0 + u * 16 + g + 8 * (i / 2);
        const bool visible = !test_each || (row_valid[e] && key >= seen_first[e] && key < seen_end[e]);
        double value = score[u][i] * p.scale;
        if (kExtended && visible) {
          if (p.softcap > 0) value = p.softcap * tanh(value / p.softcap);
          if (masked) value += mask_s[(warp * 8 + 2 * t + e) * kProbPitch + u * 16 + g + 8 * (i / 2)];
          if (slope != 0) value -= slope * static_cast<double>(llabs(diagonal[e] - key));
        }
        score[u][i] = visible ? value : neg_inf;
        tile_max[e] = fmax(tile_max[e], score[u][i]);
      }
    }
    double rescale[2], new_max[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      new_max[e] = fmax(running_max[e], across_keys_max(tile_max[e]));
      // While every key so far is hidden the row has nothing to rescale (and -inf - -inf is NaN).
      rescale[e] = new_max[e] == neg_inf ? 1.0 : exp(running_max[e] - new_max[e]);
      running_max[e] = new_max[e];
      running_sum[e] *= rescale[e];
    }
    double* my_probs = p_s + (warp * 8) * kProbPitch;
#pragma unroll
    for (int u = 0; u < kScoreTiles; ++u) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int e = i % 2;
        const double weight = score[u][i] == neg_inf ? 0.0 : exp(score[u][i] - new_max[e]);
        running_sum[e] += weight;
        my_probs[(2 * t + e) * kProbPitch + u * 16 + g + 8 * (i / 2)] = weight;
      }
    }
#pragma unroll
    for (int w = 0; w < kValueTiles; ++w) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[w][i] *= rescale[i % 2];
    }

    wait_for_copies<1>();  // this tile's V (the next K may still be coming)
    __syncthreads();       // ... seen by every thread (and this warp's P by its own lanes)

    // Oᵀ += Vᵀ Pᵀ over 16 k-steps of 4 keys (hidden or missing keys: weight 0 and a zero V row).
#pragma unroll 4
    for (int s = 0; s < kKeys / 4; ++s) {
      const double prob = my_probs[g * kProbPitch + s * 4 + t];
      const double* value_row = v_s + (s * 4 + t) * pitch(kWidthVo) + g;
#pragma unroll
      for (int w = 0; w < kValueTiles; ++w) {
        if (w * 16 < dv) mma_f64(acc[w], value_row[w * 16], value_row[w * 16 + 8], prob);
      }
    }
  }
  wait_for_copies<0>();  // nothing may still be writing to shared memory when the block ends

  // A row with no visible key gives 0, as the CPU reference (and torch's math backend) does.
  double sum[2], out_scale[2] = {1.0, 1.0};
  for (int e = 0; e < 2; ++e) sum[e] = across_keys_sum(running_sum[e]);
  for (int e = 0; e < 2; ++e) {
    if (row_valid[e] && sum[e] == 0.0 && g == 0 && p.fully_masked_rows) atomicAdd(p.fully_masked_rows, 1ull);
  }
  if (kExtended && p.sinks) {
    // The sink joins the denominator of a row that sees a key, as one more logit of no value; when
    // it is the row's largest, the sum and the output are rescaled to it (as the CPU reference).
    const double sink = p.sinks[h];
    for (int e = 0; e < 2; ++e) {
      if (sum[e] == 0.0 || sink == neg_inf) continue;
      if (sink > running_max[e]) {
        out_scale[e] = exp(running_max[e] - sink);
        sum[e] = sum[e] * out_scale[e] + 1.0;
      } else {
        sum[e] += exp(sink - running_max[e]);
      }
    }
  }
#pragma unroll
  for (int w = 0; w < kValueTiles; ++w) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = i % 2, column = w * 16 + g + 8 * (i / 2);
      const std::int64_t row = warp_row0 + 2 * t + e;
      if (row_valid[e] && column < dv) {
        p.out[(bh * p.rows + row) * dv + column] = sum[e] == 0.0 ? 0.0 : acc[w][i] * out_scale[e] / sum[e];
      }
    }
  }
}

template <int kWidthQk, int kWidthVo, bool kExtended>
const char* launch_instance(const FusedReferenceProblem& problem, cudaStream_t stream) {
  constexpr std::size_t bytes = shared_bytes<kWidthQk, kWidthVo, kExtended>();
  static_assert(bytes <= 227 * 1024, "the tiles must fit a block's shared memory");
  const auto kernel = fused_reference_kernel<kWidthQk, kWidthVo, kExtended>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)) != cudaSuccess) {
    return "reference_fused.cu: cudaFuncSetAttribute(MaxDynamicSharedMemorySize) failed";
  }
  const dim3 grid(static_cast<unsigned>((problem.rows + kRows - 1) / kRows),
                  static_cast<unsigned>(problem.batch * problem.heads_q));
  kernel<<<grid, kThreads, bytes, stream>>>(problem);
  return cudaGetLastError() == cudaSuccess ? nullptr : "reference_fused.cu: kernel launch failed";
}

template <int kWidthQk, int kWidthVo>
const char* launch(const FusedReferenceProblem& problem, cudaStream_t stream) {
  return problem.extended() ? launch_instance<kWidthQk, kWidthVo, true>(problem, stream)
                            : launch_instance<kWidthQk, kWidthVo, false>(problem, stream);
}

}  // namespace

bool fused_reference_supports(std::int64_t head_dim, std::int64_t head_dim_vo) {
  return head_dim >= 1 && head_dim <= kMaxHeadDim && head_dim_vo >= 1 && head_dim_vo <= kMaxHeadDim;
}

const char* launch_fused_reference(const FusedReferenceProblem& problem, cudaStream_t stream) {
  if (!fused_reference_supports(problem.head_dim, problem.head_dim_vo)) return "head dims beyond the fused path";
  if (problem.rows == 0 || problem.batch * problem.heads_q == 0) return nullptr;
  if (problem.batch * problem.heads_q > 65535) return "more than 65535 (batch x head) pairs for one launch";
  const bool narrow = problem.head_dim <= 64, narrow_vo = problem.head_dim_vo <= 64;
  if (narrow && narrow_vo) return launch<64, 64>(problem, stream);
  if (narrow) return launch<64, 128>(problem, stream);
  if (narrow_vo) return launch<128, 64>(problem, stream);
  return launch<128, 128>(problem, stream);
}

}  // namespace attnreplay
