// The input preparation's persistent kernel (kernels/cuda/preparation.h). Arithmetic is the
// definition's, operation by operation (docs/quantized.md) and as kernels/quantized_attention.cpp
// emulates it: the _rn intrinsics keep nvcc from fusing a multiply and an add into one rounding.
#include <algorithm>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/preparation.h"

namespace attnreplay::cuda_attention {
namespace {

constexpr int kThreads = 256;
constexpr int kGatherRows = 128;   // rows an abs_max step
constexpr int kCopyRows = 128;     // rows a copy step
constexpr int kMeanChannels = 32;  // one warp sums them, one channel a thread
constexpr int kMeanKeys = 256;     // keys a shared-memory stage of the mean
// The largest step's shared memory: 128 rows of dim 128 (K's INT8 block, V's FP8 tile) and two
// rows of floats; the mean's two stages are 32 KB.
constexpr int kSharedBytes = 128 * 128 * 2 + 2 * 128 * 4;

template <typename Elem>
__device__ __forceinline__ const Elem* row_pointer(const InputView& in, std::int64_t head, std::int64_t s) {
  const std::int64_t b = head / in.heads, h = head % in.heads;
  return static_cast<const Elem*>(in.data) + b * in.stride_b + h * in.stride_h + s * in.stride_s;
}

// Eight 16-bit elements (16 bytes, aligned) as floats.
template <typename Elem>
__device__ __forceinline__ void load8(const Elem* p, float (&x)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const Elem* e = reinterpret_cast<const Elem*>(&raw);
#pragma unroll
  for (int k = 0; k < 8; ++k) x[k] = to_float(e[k]);
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned value;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(value) : "l"(p) : "memory");
  return value;
}

// ---- Layout change ----

template <int kDim>
__device__ void copy_step(const PreparedInput& t, std::int64_t head, std::int64_t block) {
  constexpr int kVectors = kDim * 2 / 16;
  const InputView& in = t.in;
  const std::int64_t first = block * kCopyRows;
  const int rows = static_cast<int>(min(static_cast<std::int64_t>(kCopyRows), in.seq - first));
  uint4* out = static_cast<uint4*>(t.out) + (head * in.seq + first) * kVectors;
  for (int i = static_cast<int>(threadIdx.x); i < rows * kVectors; i += kThreads) {
    const int row = i / kVectors, vector = i % kVectors;
    out[i] = reinterpret_cast<const uint4*>(row_pointer<std::uint16_t>(in, head, first + row))[vector];
  }
}

// ---- K smoothing: 32 channels' means, summed in key order ----

template <typename Elem>
__device__ void channel_mean_step(const PreparedInput& t, std::int64_t head, int group, unsigned char* shared) {
  // The order of the sum is the definition's, so one thread adds up one channel; the CTA streams
  // the keys through shared memory (double-buffered) so that its adds never wait for DRAM.
  auto stage = reinterpret_cast<Elem(*)[kMeanKeys][kMeanChannels]>(shared);
  const InputView& in = t.in;
  const int c0 = group * kMeanChannels;
  const Elem* base = row_pointer<Elem>(in, head, 0) + c0;
  const std::int64_t stages = (in.seq + kMeanKeys - 1) / kMeanKeys;
  auto load = [&](std::int64_t st) {
    constexpr int kVectorsPerKey = kMeanChannels * 2 / 16;
    for (int v = static_cast<int>(threadIdx.x); v < kMeanKeys * kVectorsPerKey; v += kThreads) {
      const int row = v / kVectorsPerKey, column = (v % kVectorsPerKey) * 8;
      const std::int64_t key = st * kMeanKeys + row;
      const bool valid = key < in.seq;
      cp_async_16(&stage[st % 2][row][column], valid ? base + key * in.stride_s + column : base, valid);
    }
  };
  load(0);
  cp_async_commit();
  float sum = 0.0f;
  for (std::int64_t st = 0; st < stages; ++st) {
    if (st + 1 < stages) {
      load(st + 1);  // into the buffer every thread finished reading at the end of st - 1
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (threadIdx.x < kMeanChannels) {
      const int keys = static_cast<int>(min(static_cast<std::int64_t>(kMeanKeys), in.seq - st * kMeanKeys));
      for (int j = 0; j < keys; ++j) sum = __fadd_rn(sum, to_float(stage[st % 2][j][threadIdx.x]));
    }
    __syncthreads();
  }
  if (threadIdx.x < kMeanChannels) {
    t.mean[head * in.head_dim + c0 + threadIdx.x] = __fdiv_rn(sum, static_cast<float>(in.seq));
  }
}

// ---- INT8 codes with a scale per group ----

// One block of rows (64 of Q, 128 of K) of one head: every group lies inside it. The rows are
// staged in shared memory as loaded (16-bit), and x is computed twice from them, once for the
// maxima and once for the codes, by the same operations: registers would hold 64 floats a thread.
template <typename Elem, int kDim, int kRows>
__device__ void int8_step(const PreparedInput& t, std::int64_t head, std::int64_t block, unsigned char* shared) {
  constexpr int kThreadsPerRow = kThreads / kRows;
  constexpr int kPerThread = kDim / kThreadsPerRow;
  constexpr int kVectorsPerRow = kDim / 8, kVectorsPerThread = kPerThread / 8;
  static_assert(kPerThread % 16 == 0, "whole 16-byte vectors of codes");
  static_assert(kRows * kDim * 2 + (kRows + kDim) * 4 <= kSharedBytes, "the block fits");
  uint4* tile = reinterpret_cast<uint4*>(shared);
  float* row_amax = reinterpret_cast<float*>(shared + kRows * kDim * sizeof(Elem));
  float* mean = row_amax + kRows;
  // A row's vectors are permuted by (row, thread) so that the 8 threads of a quarter warp, which
  // read 8 different rows' or parts' vectors at once, hit 8 different bank groups.
  auto slot = [](int row, int vector) {
    return row * kVectorsPerRow + (vector ^ ((row * kThreadsPerRow + vector / kVectorsPerThread) & 7));
  };
  const InputView& in = t.in;
  const std::int64_t first = block * kRows;
  for (int v = static_cast<int>(threadIdx.x); v < kRows * kVectorsPerRow; v += kThreads) {
    const int row = v / kVectorsPerRow, vector = v % kVectorsPerRow;
    const bool valid = first + row < in.seq;
    cp_async_16(&tile[slot(row, vector)], row_pointer<Elem>(in, head, valid ? first + row : 0) + vector * 8, valid);
  }
  cp_async_commit();
  if (t.mean) {
    for (int c = static_cast<int>(threadIdx.x); c < kDim; c += kThreads) mean[c] = __ldcg(t.mean + head * kDim + c);
  }
  cp_async_wait<0>();
  __syncthreads();

  const int r = static_cast<int>(threadIdx.x) / kThreadsPerRow;
  const int part = static_cast<int>(threadIdx.x) % kThreadsPerRow;
  const std::int64_t i = first + r;
  const int c0 = part * kPerThread;
  const bool inside = i < in.seq;
  // Rows past the end belong to no group: zero, they leave every amax as it is.
  auto vector_values = [&](int v, float (&x)[8]) {
    const uint4 raw = tile[slot(r, part * kVectorsPerThread + v)];
    const Elem* e = reinterpret_cast<const Elem*>(&raw);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float value = __fmul_rn(to_float(e[k]), t.pre_scale);  // pre_scale is 1 for K: exact
      if (t.mean) value = __fsub_rn(value, mean[c0 + v * 8 + k]);
      x[k] = inside ? value : 0.0f;
    }
  };
  float amax = 0.0f;
#pragma unroll
  for (int v = 0; v < kVectorsPerThread; ++v) {
    float x[8];
    vector_values(v, x);
#pragma unroll
    for (int k = 0; k < 8; ++k) amax = fmaxf(amax, fabsf(x[k]));
  }
#pragma unroll
  for (int offset = 1; offset < kThreadsPerRow; offset *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  if (part == 0) row_amax[r] = amax;
  __syncthreads();

  // This row's group: its first row, stride and size, and the group's index in the block.
  int first_row = 0, stride = 1, count = kRows, index = 0;
  bool leader = r == 0;
  if (!t.is_key && t.granularity == Granularity::per_warp) {
    first_row = r / kWarpQ * kWarpQ, count = kWarpQ, index = r / kWarpQ, leader = r % kWarpQ == 0;
  } else if (!t.is_key && t.granularity == Granularity::per_thread) {
    // Rows r and r + 8 of a warp tile: the rows one thread's MMA fragment holds.
    first_row = r / kWarpQ * kWarpQ + r % 8, stride = 8, count = 2, index = r / kWarpQ * 8 + r % 8;
    leader = r % kWarpQ < 8;
  } else if (t.is_key && t.granularity == Granularity::per_thread) {
    // Keys with equal index mod 8: the key columns one thread's fragment holds.
    first_row = r % 8, stride = 8, count = kRows / 8, index = r % 8, leader = r < 8;
  }
  float group_amax = 0.0f;
  for (int k = 0; k < count; ++k) group_amax = fmaxf(group_amax, row_amax[first_row + k * stride]);
  const float scale = __fdiv_rn(group_amax, 127.0f);

  std::int8_t* dst = static_cast<std::int8_t*>(t.out) + (head * t.rows + i) * kDim + c0;
#pragma unroll
  for (int v = 0; v < kPerThread / 16; ++v) {
    alignas(16) std::int8_t codes[16];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float x[8];
      vector_values(v * 2 + half, x);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int code = scale == 0.0f ? 0 : __float2int_rn(__fdiv_rn(x[k], scale));
        codes[half * 8 + k] = static_cast<std::int8_t>(max(-127, min(127, code)));
      }
    }
    reinterpret_cast<uint4*>(dst)[v] = *reinterpret_cast<const uint4*>(codes);
  }
  if (part == 0 && leader) {
    t.scales[head * t.groups + block * t.groups_per_block + index] = scale;
  }
}

// ---- max |x| of 128 rows ----

__device__ __forceinline__ std::int64_t amax_index(const PreparedInput& t, std::int64_t head) {
  return t.per_tensor ? 0 : head;
}

template <typename Elem, int kDim>
__device__ void abs_max_step(const PreparedInput& t, std::int64_t head, std::int64_t block, unsigned char* shared) {
  constexpr int kVectors = kDim / 8;
  constexpr int kRowsAPass = kThreads / kVectors;
  auto partial = reinterpret_cast<float(*)[kDim]>(shared);
  const InputView& in = t.in;
  const int vector = static_cast<int>(threadIdx.x) % kVectors, row = static_cast<int>(threadIdx.x) / kVectors;
  const std::int64_t first = block * kGatherRows;
  const std::int64_t end = min(in.seq, first + kGatherRows);
  float m[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (std::int64_t s = first + row; s < end; s += kRowsAPass) {
    float x[8];
    load8(row_pointer<Elem>(in, head, s) + vector * 8, x);
#pragma unroll
    for (int k = 0; k < 8; ++k) m[k] = fmaxf(m[k], fabsf(x[k]));
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) partial[row][vector * 8 + k] = m[k];
  __syncthreads();
  // max is exact in any order: atomics across CTAs change nothing.
  if (t.per_channel) {
    if (threadIdx.x < kDim) {
      float channel = 0.0f;
      for (int r = 0; r < kRowsAPass; ++r) channel = fmaxf(channel, partial[r][threadIdx.x]);
      atomicMax(t.amax + head * kDim + threadIdx.x, __float_as_uint(channel));
    }
  } else if (threadIdx.x < 32) {
    float all = 0.0f;
    for (int k = static_cast<int>(threadIdx.x); k < kRowsAPass * kDim; k += 32) all = fmaxf(all, (&partial[0][0])[k]);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) all = fmaxf(all, __shfl_xor_sync(0xffffffffu, all, offset));
    if (threadIdx.x == 0) atomicMax(t.amax + amax_index(t, head), __float_as_uint(all));
  }
}

// ---- FP8 ----

__device__ __forceinline__ std::uint8_t fp8_code(float x, float scale) {
  return scale == 0.0f ? std::uint8_t{0} : to_e4m3(__fdiv_rn(x, scale));
}

// A gathered maximum as a scale, as the emulation divides it.
__device__ __forceinline__ float fp8_scale(const PreparedInput& t, std::int64_t index) {
  return __fdiv_rn(__uint_as_float(__ldcg(t.amax + index)), t.fp8_target);
}

template <typename Elem, int kDim>
__device__ void fp8_rows_step(const PreparedInput& t, std::int64_t head, std::int64_t block) {
  constexpr int kVectors = kDim / 16;  // 16 codes a vector
  const InputView& in = t.in;
  const float scale = fp8_scale(t, amax_index(t, head));
  if (block == 0 && threadIdx.x == 0) t.scales[head] = scale;
  const std::int64_t first = block * t.block_rows;
  uint4* out = reinterpret_cast<uint4*>(static_cast<std::uint8_t*>(t.out) + (head * t.rows + first) * kDim);
  for (int i = static_cast<int>(threadIdx.x); i < t.block_rows * kVectors; i += kThreads) {
    const int row = i / kVectors, vector = i % kVectors;
    alignas(16) std::uint8_t codes[16] = {};
    if (first + row < in.seq) {
      const Elem* src = row_pointer<Elem>(in, head, first + row) + vector * 16;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float x[8];
        load8(src + half * 8, x);
#pragma unroll
        for (int k = 0; k < 8; ++k) codes[half * 8 + k] = fp8_code(x[k], scale);
      }
    }
    out[i] = *reinterpret_cast<const uint4*>(codes);
  }
}

// The key a position of V's permuted 32-key chunk holds: position p = 4 t + e of the lower or upper
// 16 is what lane-column t's A-fragment byte e of P is, keys 2t, 2t + 1, 8 + 2t, 9 + 2t (+ 16).
__device__ __forceinline__ int permuted_key(int p) {
  return (p & 16) | (((p >> 1) & 1) << 3) | (((p >> 2) & 3) << 1) | (p & 1);
}

template <typename Elem, int kDim>
__device__ void fp8_values_step(const PreparedInput& t, std::int64_t head, std::int64_t block, unsigned char* shared) {
  // The tile's columns are swizzled by the key's 16-key group: the write loop's warp reads 8
  // groups' keys at once, which would otherwise all fall in one bank.
  auto tile = reinterpret_cast<Elem(*)[kDim]>(shared);
  float* channel_scale = reinterpret_cast<float*>(shared + kBlockK * kDim * sizeof(Elem));
  auto swizzled = [](int key, int c) { return c ^ (((key >> 4) & 7) << 3); };
  const InputView& in = t.in;
  const std::int64_t key0 = block * kBlockK;
  for (int c = static_cast<int>(threadIdx.x); c < kDim; c += kThreads) {
    const float scale = fp8_scale(t, t.per_channel ? head * kDim + c : amax_index(t, head));
    channel_scale[c] = scale;
    if (block == 0 && (t.per_channel || c == 0)) t.scales[t.per_channel ? head * kDim + c : head] = scale;
  }
  constexpr int kVectors = kDim / 8;
  for (int v = static_cast<int>(threadIdx.x); v < kBlockK * kVectors; v += kThreads) {
    const int row = v / kVectors, column = (v % kVectors) * 8;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (key0 + row < in.seq) value = *reinterpret_cast<const uint4*>(row_pointer<Elem>(in, head, key0 + row) + column);
    *reinterpret_cast<uint4*>(&tile[row][swizzled(row, column)]) = value;
  }
  __syncthreads();
  // Out: a channel's 128 keys are 8 vectors of 16 codes.
  std::uint8_t* out = static_cast<std::uint8_t*>(t.out);
  for (int item = static_cast<int>(threadIdx.x); item < kDim * 8; item += kThreads) {
    const int c = item / 8, group = item % 8;
    const float scale = channel_scale[c];
    alignas(16) std::uint8_t codes[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      const int p = group * 16 + k;
      const int key = (p & ~31) + permuted_key(p & 31);
      codes[k] = key0 + key < in.seq ? fp8_code(to_float(tile[key][swizzled(key, c)]), scale) : std::uint8_t{0};
    }
    *reinterpret_cast<uint4*>(out + (head * kDim + c) * t.rows + key0 + group * 16) = *reinterpret_cast<const uint4*>(codes);
  }
}

// ---- The kernel ----

template <typename Elem, int kDim>
__global__ void __launch_bounds__(kThreads, 3) preparation_kernel(const PreparationArgs args) {
  static_assert(kBlockK * kDim * 2 + kDim * 4 <= kSharedBytes && 2 * kMeanKeys * kMeanChannels * 2 <= kSharedBytes,
                "every step's shared memory fits");
  __shared__ __align__(16) unsigned char shared[kSharedBytes];
  __shared__ std::uint32_t next;
  if (threadIdx.x == 0) next = atomicAdd(args.counters, 1u);
  __syncthreads();
  for (;;) {
    const std::uint32_t index = next;
    if (index >= args.step_count) return;
    const Step step = args.steps[index];
    __syncthreads();  // every thread has read `next`
    if (threadIdx.x == 0) {
      next = atomicAdd(args.counters, 1u);  // read after this step's last barrier
      if (step.wait != 0) {
        while (load_acquire(args.counters + step.wait) < step.wait_count) __nanosleep(256);
        __threadfence();
      }
    }
    __syncthreads();
    const PreparedInput& t = args.inputs[step.tensor];
    const std::int64_t head = step.head, block = step.block;
    switch (step.kind) {
      case StepKind::copy: copy_step<kDim>(t, head, block); break;
      case StepKind::channel_mean: channel_mean_step<Elem>(t, head, static_cast<int>(block), shared); break;
      case StepKind::int8_block:
        if (t.is_key) int8_step<Elem, kDim, kBlockK>(t, head, block, shared);
        else int8_step<Elem, kDim, kBlockQ>(t, head, block, shared);
        break;
      case StepKind::abs_max_block: abs_max_step<Elem, kDim>(t, head, block, shared); break;
      case StepKind::fp8_rows_block: fp8_rows_step<Elem, kDim>(t, head, block); break;
      case StepKind::fp8_values_block: fp8_values_step<Elem, kDim>(t, head, block, shared); break;
    }
    if (step.signal != 0) {
      __threadfence();  // this thread's writes, before the count that publishes them
      __syncthreads();
      if (threadIdx.x == 0) atomicAdd(args.counters + step.signal, 1u);
    }
    __syncthreads();  // shared memory free for the next step, `next` written
  }
}

// Runs LAUNCH with Elem and kDim naming the element type and head dim (C++17: no templated
// lambdas).
#define ATTNREPLAY_FOR_ELEMENT_AND_DIM(element, head_dim, LAUNCH)                                        \
  do {                                                                                                 \
    const bool bf16_ = (element) == Element::bf16;                                                     \
    if ((head_dim) == 64 && bf16_) {                                                                   \
      using Elem = __nv_bfloat16;                                                                      \
      constexpr int kDim = 64;                                                                         \
      LAUNCH;                                                                                          \
    } else if ((head_dim) == 64) {                                                                     \
      using Elem = __half;                                                                             \
      constexpr int kDim = 64;                                                                         \
      LAUNCH;                                                                                          \
    } else if ((head_dim) == 128 && bf16_) {                                                           \
      using Elem = __nv_bfloat16;                                                                      \
      constexpr int kDim = 128;                                                                        \
      LAUNCH;                                                                                          \
    } else if ((head_dim) == 128) {                                                                    \
      using Elem = __half;                                                                             \
      constexpr int kDim = 128;                                                                        \
      LAUNCH;                                                                                          \
    } else {                                                                                           \
      throw std::invalid_argument("input preparation: head dim " + std::to_string(head_dim) +          \
                                  " (64 or 128 only)");                                                \
    }                                                                                                  \
  } while (false)

}  // namespace

int int8_groups_per_block(bool is_key, Granularity granularity) {
  if (granularity == Granularity::per_thread) return is_key ? 8 : 32;
  if (granularity == Granularity::per_warp && !is_key) return kBlockQ / kWarpQ;
  return 1;
}

int preparation_grid(Element element, int head_dim, int ctas_per_sm) {
  int device = 0, multiprocessors = 0, resident = 0;
  ATTNREPLAY_CUDA_CHECK(cudaGetDevice(&device));
  ATTNREPLAY_CUDA_CHECK(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device));
  ATTNREPLAY_FOR_ELEMENT_AND_DIM(element, head_dim,
                                 ATTNREPLAY_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                                     &resident, preparation_kernel<Elem, kDim>, kThreads, 0)));
  return multiprocessors * std::max(1, std::min(resident, ctas_per_sm));
}

void run_preparation(const PreparationArgs& args, Element element, int head_dim, int grid, cudaStream_t stream) {
  ATTNREPLAY_FOR_ELEMENT_AND_DIM(element, head_dim,
                                 (preparation_kernel<Elem, kDim><<<grid, kThreads, 0, stream>>>(args)));
  ATTNREPLAY_CUDA_CHECK_LAUNCH("preparation_kernel");
}

}  // namespace attnreplay::cuda_attention
