// The input preparation's persistent kernel (kernels/cuda/preparation.h). Arithmetic is the
// definition's, operation by operation (docs/quantized.md) and as kernels/quantized_attention.cpp
// emulates it: the _rn intrinsics keep nvcc from fusing a multiply and an add into one rounding.
//
// A CTA is 8 consumer warps and one producer warp. While the consumers work on a step from one
// shared-memory stage, the producer takes the next step, copies its rows into the other stage and
// waits for what it depends on, so that neither DRAM's latency nor the step list's is in the path.
#include <algorithm>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/preparation.h"

namespace attnreplay::cuda_attention {
namespace {

constexpr int kConsumers = 256;
constexpr int kThreads = kConsumers + 32;
constexpr int kConsumerBarrier = 1;  // named barrier of the consumer warps (0 is __syncthreads')
constexpr int kStageRows = 128;      // rows a step at most
constexpr int kStageBytes = kStageRows * 128 * 2;
constexpr int kScratchBytes = 8 * 1024 + 2 * 128 * 4;  // a step's own figures (maxima, means, scales)
constexpr int kSharedBytes = 2 * kStageBytes + kScratchBytes;
constexpr int kMeanChannels = 32;  // one warp sums them, one channel a thread
constexpr int kMeanKeys = 256;     // keys a shared-memory stage of the mean
static_assert(2 * kMeanKeys * kMeanChannels * 2 <= kStageBytes, "the mean streams through one stage");

__device__ __forceinline__ void consumer_sync() { named_barrier_sync(kConsumerBarrier, kConsumers); }

template <typename Elem>
__device__ __forceinline__ const Elem* row_pointer(const InputView& in, std::int64_t head, std::int64_t s) {
  const std::int64_t b = head / in.heads, h = head % in.heads;
  return static_cast<const Elem*>(in.data) + b * in.stride_b + h * in.stride_h + s * in.stride_s;
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned value;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(value) : "l"(p) : "memory");
  return value;
}

// ---- Staged rows ----
// Row r's 16-byte vector j sits at j ^ (((r >> 4) ^ r) & 7): the threads of a quarter warp, which
// read 8 rows, 8 of a row's vectors, or (V's transpose) 8 rows 16 apart, hit 8 bank groups.
template <int kDim>
__device__ __forceinline__ int staged(int row, int vector) {
  return row * (kDim / 8) + (vector ^ (((row >> 4) ^ row) & 7));
}

template <typename Elem, int kDim>
__device__ __forceinline__ void staged_values(const uint4* stage, int row, int vector, float (&x)[8]) {
  const uint4 raw = stage[staged<kDim>(row, vector)];
  const Elem* e = reinterpret_cast<const Elem*>(&raw);
#pragma unroll
  for (int k = 0; k < 8; ++k) x[k] = to_float(e[k]);
}

// Rows a step reads (0: it reads the head itself, as the mean does).
__device__ __forceinline__ int step_rows(const PreparedInput& t, StepKind kind) {
  switch (kind) {
    case StepKind::channel_mean: return 0;
    case StepKind::int8_block:
    case StepKind::fp8_rows_block: return t.block_rows;
    default: return kStageRows;
  }
}

// The producer warp: cp.async of the step's rows, zeros past the end.
template <typename Elem, int kDim>
__device__ void stage_rows(const PreparedInput& t, const Step& step, uint4* stage, int lane) {
  const int rows = step_rows(t, step.kind);
  const std::int64_t first = static_cast<std::int64_t>(step.block) * rows;
  for (int v = lane; v < rows * (kDim / 8); v += 32) {
    const int row = v / (kDim / 8), vector = v % (kDim / 8);
    const bool valid = first + row < t.in.seq;
    cp_async_16(stage + staged<kDim>(row, vector),
                row_pointer<Elem>(t.in, step.head, valid ? first + row : 0) + vector * 8, valid);
  }
}

// ---- Layout change ----

template <int kDim>
__device__ void copy_step(const PreparedInput& t, std::int64_t head, std::int64_t block, const uint4* stage) {
  constexpr int kVectors = kDim / 8;
  const std::int64_t first = block * kStageRows;
  const int rows = static_cast<int>(min(static_cast<std::int64_t>(kStageRows), t.in.seq - first));
  uint4* out = static_cast<uint4*>(t.out) + (head * t.in.seq + first) * kVectors;
  for (int i = static_cast<int>(threadIdx.x); i < rows * kVectors; i += kConsumers) {
    out[i] = stage[staged<kDim>(i / kVectors, i % kVectors)];
  }
}

// ---- K smoothing: 32 channels' means, summed in key order ----

template <typename Elem>
__device__ void channel_mean_step(const PreparedInput& t, std::int64_t head, int group, uint4* shared) {
  // The order of the sum is the definition's, so one thread adds up one channel; the consumers
  // stream the keys through the stage (double-buffered) so that the adds never wait for DRAM.
  auto stage = reinterpret_cast<Elem(*)[kMeanKeys][kMeanChannels]>(shared);
  const InputView& in = t.in;
  const int c0 = group * kMeanChannels;
  const Elem* base = row_pointer<Elem>(in, head, 0) + c0;
  const std::int64_t stages = (in.seq + kMeanKeys - 1) / kMeanKeys;
  auto load = [&](std::int64_t st) {
    constexpr int kVectorsPerKey = kMeanChannels * 2 / 16;
    for (int v = static_cast<int>(threadIdx.x); v < kMeanKeys * kVectorsPerKey; v += kConsumers) {
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
    consumer_sync();
    if (threadIdx.x < kMeanChannels) {
      const int keys = static_cast<int>(min(static_cast<std::int64_t>(kMeanKeys), in.seq - st * kMeanKeys));
      for (int j = 0; j < keys; ++j) sum = __fadd_rn(sum, to_float(stage[st % 2][j][threadIdx.x]));
    }
    consumer_sync();
  }
  if (threadIdx.x < kMeanChannels) {
    t.mean[head * in.head_dim + c0 + threadIdx.x] = __fdiv_rn(sum, static_cast<float>(in.seq));
  }
}

// ---- INT8 codes with a scale per group ----

// One block of rows (64 of Q, 128 of K) of one head: every group lies inside it. x is computed
// twice from the staged rows, once for the maxima and once for the codes, by the same operations:
// registers would hold 64 floats a thread.
template <typename Elem, int kDim, int kRows>
__device__ void int8_step(const PreparedInput& t, std::int64_t head, std::int64_t block, const uint4* stage,
                          float* scratch) {
  constexpr int kThreadsPerRow = kConsumers / kRows;
  constexpr int kPerThread = kDim / kThreadsPerRow;
  constexpr int kVectorsPerThread = kPerThread / 8;
  static_assert(kPerThread % 16 == 0, "whole 16-byte vectors of codes");
  float* row_amax = scratch;
  float* mean = scratch + kRows;
  const InputView& in = t.in;
  if (t.mean) {
    for (int c = static_cast<int>(threadIdx.x); c < kDim; c += kConsumers) mean[c] = __ldcg(t.mean + head * kDim + c);
    consumer_sync();
  }
  const int r = static_cast<int>(threadIdx.x) / kThreadsPerRow;
  const int part = static_cast<int>(threadIdx.x) % kThreadsPerRow;
  const std::int64_t i = block * kRows + r;
  const int c0 = part * kPerThread;
  const bool inside = i < in.seq;
  // Rows past the end belong to no group: zero, they leave every amax as it is.
  auto vector_values = [&](int v, float (&x)[8]) {
    staged_values<Elem, kDim>(stage, r, part * kVectorsPerThread + v, x);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float value = __fmul_rn(x[k], t.pre_scale);  // pre_scale is 1 for K: exact
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
  consumer_sync();

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
  if (part == 0 && leader) t.scales[head * t.groups + block * t.groups_per_block + index] = scale;
}

// ---- max |x| of 128 rows ----

__device__ __forceinline__ std::int64_t amax_index(const PreparedInput& t, std::int64_t head) {
  return t.per_tensor ? 0 : head;
}

template <typename Elem, int kDim>
__device__ void abs_max_step(const PreparedInput& t, std::int64_t head, std::int64_t block, const uint4* stage,
                             float* scratch) {
  constexpr int kVectors = kDim / 8;
  constexpr int kRowsAPass = kConsumers / kVectors;
  static_assert(kRowsAPass * kDim * 4 <= kScratchBytes, "the partial maxima fit");
  auto partial = reinterpret_cast<float(*)[kDim]>(scratch);
  const int vector = static_cast<int>(threadIdx.x) % kVectors, row = static_cast<int>(threadIdx.x) / kVectors;
  // Staged rows past the end are zeros: they leave the maxima as they are.
  float m[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll 4
  for (int s = row; s < kStageRows; s += kRowsAPass) {
    float x[8];
    staged_values<Elem, kDim>(stage, s, vector, x);
#pragma unroll
    for (int k = 0; k < 8; ++k) m[k] = fmaxf(m[k], fabsf(x[k]));
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) partial[row][vector * 8 + k] = m[k];
  consumer_sync();
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
__device__ void fp8_rows_step(const PreparedInput& t, std::int64_t head, std::int64_t block, const uint4* stage) {
  constexpr int kVectors = kDim / 16;  // 16 codes a vector
  const float scale = fp8_scale(t, amax_index(t, head));
  if (block == 0 && threadIdx.x == 0) t.scales[head] = scale;
  const std::int64_t first = block * t.block_rows;
  uint4* out = reinterpret_cast<uint4*>(static_cast<std::uint8_t*>(t.out) + (head * t.rows + first) * kDim);
  for (int i = static_cast<int>(threadIdx.x); i < t.block_rows * kVectors; i += kConsumers) {
    const int row = i / kVectors, vector = i % kVectors;
    alignas(16) std::uint8_t codes[16] = {};
    if (first + row < t.in.seq) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float x[8];
        staged_values<Elem, kDim>(stage, row, vector * 2 + half, x);
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
__device__ void fp8_values_step(const PreparedInput& t, std::int64_t head, std::int64_t block, const uint4* stage,
                                float* scratch) {
  float* channel_scale = scratch;
  const std::int64_t key0 = block * kBlockK;
  for (int c = static_cast<int>(threadIdx.x); c < kDim; c += kConsumers) {
    const float scale = fp8_scale(t, t.per_channel ? head * kDim + c : amax_index(t, head));
    channel_scale[c] = scale;
    if (block == 0 && (t.per_channel || c == 0)) t.scales[t.per_channel ? head * kDim + c : head] = scale;
  }
  consumer_sync();
  // Out: a channel's 128 keys are 8 vectors of 16 codes.
  std::uint8_t* out = static_cast<std::uint8_t*>(t.out);
  for (int item = static_cast<int>(threadIdx.x); item < kDim * 8; item += kConsumers) {
    const int c = item / 8, group = item % 8;
    const float scale = channel_scale[c];
    alignas(16) std::uint8_t codes[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      const int p = group * 16 + k;
      const int key = (p & ~31) + permuted_key(p & 31);
      const Elem value = reinterpret_cast<const Elem*>(stage + staged<kDim>(key, c / 8))[c % 8];
      codes[k] = key0 + key < t.in.seq ? fp8_code(to_float(value), scale) : std::uint8_t{0};
    }
    *reinterpret_cast<uint4*>(out + (head * kDim + c) * t.rows + key0 + group * 16) = *reinterpret_cast<const uint4*>(codes);
  }
}

// ---- The kernel ----

template <typename Elem, int kDim>
__device__ void run_step(const PreparedInput& t, const Step& step, uint4* stage, float* scratch) {
  const std::int64_t head = step.head, block = step.block;
  switch (step.kind) {
    case StepKind::copy: copy_step<kDim>(t, head, block, stage); break;
    case StepKind::channel_mean: channel_mean_step<Elem>(t, head, static_cast<int>(block), stage); break;
    case StepKind::int8_block:
      if (t.is_key) int8_step<Elem, kDim, kBlockK>(t, head, block, stage, scratch);
      else int8_step<Elem, kDim, kBlockQ>(t, head, block, stage, scratch);
      break;
    case StepKind::abs_max_block: abs_max_step<Elem, kDim>(t, head, block, stage, scratch); break;
    case StepKind::fp8_rows_block: fp8_rows_step<Elem, kDim>(t, head, block, stage); break;
    case StepKind::fp8_values_block: fp8_values_step<Elem, kDim>(t, head, block, stage, scratch); break;
  }
}

template <typename Elem, int kDim>
__global__ void __launch_bounds__(kThreads, 2) preparation_kernel(const PreparationArgs args) {
  extern __shared__ uint4 shared[];
  uint4* stages[2] = {shared, shared + kStageBytes / 16};
  float* scratch = reinterpret_cast<float*>(shared + 2 * kStageBytes / 16);
  __shared__ Step steps[2];
  __shared__ bool more[2];
  const bool producer = threadIdx.x >= kConsumers;
  const int lane = static_cast<int>(threadIdx.x) % 32;

  // The producer: takes the next step, stages its rows in `stage`, waits for what it needs.
  auto take = [&](int slot) {
    if (lane == 0) {
      const std::uint32_t index = atomicAdd(args.counters, 1u);
      more[slot] = index < args.step_count;
      if (more[slot]) steps[slot] = args.steps[index];
    }
    __syncwarp();
    if (!more[slot]) return;
    const Step step = steps[slot];
    const PreparedInput& t = args.inputs[step.tensor];
    stage_rows<Elem, kDim>(t, step, stages[slot], lane);
    cp_async_commit();
    if (lane == 0 && step.wait != 0) {
      while (load_acquire(args.counters + step.wait) < step.wait_count) __nanosleep(128);
      __threadfence();
    }
    cp_async_wait<0>();
  };

  if (producer) take(0);
  __syncthreads();
  for (int n = 0;; ++n) {
    const int slot = n & 1;
    if (!more[slot]) return;
    if (producer) {
      take(slot ^ 1);
    } else {
      const Step step = steps[slot];
      run_step<Elem, kDim>(args.inputs[step.tensor], step, stages[slot], scratch);
      if (step.signal != 0) {
        __threadfence();  // this thread's writes, before the count that publishes them
        consumer_sync();
        if (threadIdx.x == 0) atomicAdd(args.counters + step.signal, 1u);
      }
    }
    __syncthreads();  // the stage consumed is free, the next one is filled
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
  ATTNREPLAY_FOR_ELEMENT_AND_DIM(element, head_dim, {
    ATTNREPLAY_CUDA_CHECK(cudaFuncSetAttribute(preparation_kernel<Elem, kDim>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes));
    ATTNREPLAY_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, preparation_kernel<Elem, kDim>,
                                                                        kThreads, kSharedBytes));
  });
  return multiprocessors * std::max(1, std::min(resident, ctas_per_sm));
}

void run_preparation(const PreparationArgs& args, Element element, int head_dim, int grid, cudaStream_t stream) {
  ATTNREPLAY_FOR_ELEMENT_AND_DIM(element, head_dim,
                                 (preparation_kernel<Elem, kDim><<<grid, kThreads, kSharedBytes, stream>>>(args)));
  ATTNREPLAY_CUDA_CHECK_LAUNCH("preparation_kernel");
}

}  // namespace attnreplay::cuda_attention
