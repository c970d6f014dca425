// Input preparation kernels (kernels/cuda/quantize.h). Arithmetic is the definition's, operation
// by operation (docs/quantized.md) and as kernels/quantized_attention.cpp emulates it: the _rn
// intrinsics keep nvcc from fusing a multiply and an add into one rounding.
#include <cooperative_groups.h>
#include <cuda/atomic>

#include <algorithm>
#include <climits>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/cluster_occupancy.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/quantize.h"

namespace attnreplay::cuda_attention {
namespace {

constexpr int kQuantThreads = 256;
constexpr int kMaxKeys = 256;  // keys an abs_max CTA

template <typename Elem>
__device__ __forceinline__ const Elem* row_pointer(const InputView& in, std::int64_t b, std::int64_t h,
                                                   std::int64_t s) {
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

unsigned grid_for(std::int64_t items, int threads) {
  // Enough CTAs to fill an H100 many times over; grid-stride loops take the rest.
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min<std::int64_t>(ceil_div(items, threads), 65536)));
}

// Up to kMax inputs of one element type and head dim in one launch: CTAs (or items) [first[t],
// first[t + 1]) are input t's.
template <typename Target, int kMax>
struct LaunchTargets {
  Target target[kMax];
  int count = 0;
  std::int64_t first[kMax + 1] = {};

  __device__ __forceinline__ int of(std::int64_t index) const {
    int t = 0;
    while (t + 1 < count && index >= first[t + 1]) ++t;
    return t;
  }
};

// `items(input)` CTAs or items for each input, in order.
template <int kMax, typename Target, typename Items>
LaunchTargets<Target, kMax> launch_targets(std::initializer_list<Target> inputs, Items items, const char* what) {
  if (inputs.size() == 0 || inputs.size() > static_cast<std::size_t>(kMax)) {
    throw std::invalid_argument(std::string(what) + ": 1 to " + std::to_string(kMax) + " inputs a launch");
  }
  LaunchTargets<Target, kMax> targets;
  for (const Target& input : inputs) {
    const InputView& in = input.in, &first = inputs.begin()->in;
    if (in.element != first.element || in.head_dim != first.head_dim) {
      throw std::invalid_argument(std::string(what) + ": one launch takes inputs of one element type and head dim");
    }
    targets.target[targets.count] = input;
    targets.first[targets.count + 1] = targets.first[targets.count] + items(input);
    ++targets.count;
  }
  return targets;
}

// Per-channel |x| maxima of keys [first, end) of (b, h): each thread keeps 8 channels of every
// kRowsAPass-th key, into partial[its row][channel]; channel_max then takes a channel's over rows.
template <typename Elem, int kDim>
__device__ __forceinline__ void row_maxima(const InputView& in, int b, int h, std::int64_t first, std::int64_t end,
                                           float (&partial)[kQuantThreads / (kDim / 8)][kDim]) {
  constexpr int kVectors = kDim / 8;
  constexpr int kRowsAPass = kQuantThreads / kVectors;
  const int vector = static_cast<int>(threadIdx.x) % kVectors, row = static_cast<int>(threadIdx.x) / kVectors;
  float m[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (std::int64_t s = first + row; s < end; s += kRowsAPass) {
    float x[8];
    load8(row_pointer<Elem>(in, b, h, s) + vector * 8, x);
#pragma unroll
    for (int k = 0; k < 8; ++k) m[k] = fmaxf(m[k], fabsf(x[k]));
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) partial[row][vector * 8 + k] = m[k];
}
template <int kRows, int kDim>
__device__ __forceinline__ float channel_max(const float (&partial)[kRows][kDim], int c) {
  float channel = 0.0f;
  for (int r = 0; r < kRows; ++r) channel = fmaxf(channel, partial[r][c]);
  return channel;
}

// ---- Layout change ----

__global__ void copy_to_bhsd_kernel(const InputView in, uint4* out, int out_dim) {
  let_next_kernel_start();
  const int vectors_in = in.head_dim * 2 / 16, vectors_per_row = out_dim * 2 / 16;
  const std::int64_t total = static_cast<std::int64_t>(in.batch) * in.heads * in.seq * vectors_per_row;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int vector = static_cast<int>(i % vectors_per_row);
    const std::int64_t row = i / vectors_per_row;
    const std::int64_t s = row % in.seq, bh = row / in.seq;
    const auto* src = reinterpret_cast<const uint4*>(row_pointer<std::uint16_t>(in, bh / in.heads, bh % in.heads, s));
    out[i] = vector < vectors_in ? src[vector] : uint4{0u, 0u, 0u, 0u};
  }
  complete_after_prior_kernel();  // it reads the uploaded inputs only
}

// ---- K smoothing: channel means, block by block; V's maxima beside them ----

// load(0) + load(1) + ... + load(n - 1) in fp32, added in that order, the loads kAhead ahead of the
// adds: a load's latency is then paid once for kAhead of them rather than for each.
template <int kAhead = 8, typename Index, typename Load>
__device__ __forceinline__ float sum_in_order(Index n, Load load) {
  float sum = 0.0f;
  Index j = 0;
  for (; j + kAhead <= n; j += kAhead) {
    float value[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) value[u] = load(j + u);
#pragma unroll
    for (int u = 0; u < kAhead; ++u) sum = __fadd_rn(sum, value[u]);
  }
  if (j < n) {  // the rest, loaded together too
    float value[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) value[u] = j + u < n ? load(j + u) : 0.0f;
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      if (j + u < n) sum = __fadd_rn(sum, value[u]);
    }
  }
  return sum;
}

// A CTA sums one 128-key block of one (b, h), a thread a channel in key order, so that the blocks
// run in parallel and only the block sums are added in order: by the CTA that finishes its head
// last, which the head's counter tells (the threadfence reduction of CUDA's samples). With V's
// maxima asked for, the CTA also reads V's block meanwhile: one launch fewer on sage2's short calls.
template <typename Elem, int kDim>
__global__ void __launch_bounds__(kQuantThreads) channel_mean_kernel(const InputView in, const ChannelMeans job,
                                                                     const MaxTarget values) {
  constexpr int kVectors = kDim / 8;
  constexpr int kRowsAPass = kQuantThreads / kVectors;
  __shared__ __align__(16) Elem stage[kBlockK][kDim];
  __shared__ float v_partial[kRowsAPass][kDim];
  __shared__ bool last;
  const std::int64_t block = blockIdx.x, blocks = gridDim.x;
  const int h = static_cast<int>(blockIdx.y), b = static_cast<int>(blockIdx.z);
  const std::int64_t head = static_cast<std::int64_t>(b) * in.heads + h;
  const std::int64_t first = block * kBlockK;
  let_next_kernel_start();
  for (int v = static_cast<int>(threadIdx.x); v < kBlockK * kVectors; v += kQuantThreads) {
    const int row = v / kVectors, column = (v % kVectors) * 8;
    const bool valid = first + row < in.seq;
    cp_async_16(&stage[row][column], row_pointer<Elem>(in, b, h, valid ? first + row : 0) + column, valid);
  }
  cp_async_commit();
  if (values.amax) row_maxima<Elem, kDim>(values.in, b, h, first, min(values.in.seq, first + kBlockK), v_partial);
  cp_async_wait<0>();
  __syncthreads();
  const int c = static_cast<int>(threadIdx.x);
  if (c < kDim) {
    const int keys = static_cast<int>(min(static_cast<std::int64_t>(kBlockK), in.seq - first));
    job.block_sums[(head * blocks + block) * kDim + c] =
        sum_in_order(keys, [&](int j) { return to_float(stage[j][c]); });
    // max is exact in any order: atomics across CTAs change nothing.
    if (values.amax) atomicMax(values.amax + head * kDim + c, __float_as_uint(channel_max(v_partial, c)));
  }
  __threadfence();  // this CTA's block sums, visible before its count is
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(job.finished + head, 1u) == blocks - 1;
  __syncthreads();
  complete_after_prior_kernel();  // it reads the uploaded inputs only
  if (!last) return;
  // The head's block sums, kChunk blocks at a time into the stage (free now), copied by all the
  // threads (cp.async.cg: from L2, where other CTAs wrote them), then added in block order by a
  // thread a channel. Loaded by the adding threads, 8 ahead, they were a round trip to L2 for every
  // 8 blocks at the launch's end, which K's codes wait for. Staged, the preparation took 3-4 % less
  // at 2x24x4250x64 (sage1), 1x5x49152x128 and 1x4x65536x128, 1 % at CogVideoX, and the kernel
  // 32 registers at head dim 64, not 40 (H100, bench/results/experiments.md: 2026-11-26-h100-mean-sums-staged).
  constexpr int kChunk = static_cast<int>(sizeof(stage) / (kDim * sizeof(float)));
  float* staged = reinterpret_cast<float*>(&stage[0][0]);
  const float* sums = job.block_sums + head * blocks * kDim;
  float total = 0.0f;
  for (std::int64_t first_block = 0; first_block < blocks; first_block += kChunk) {
    const int n = static_cast<int>(min(static_cast<std::int64_t>(kChunk), blocks - first_block));
    __syncthreads();  // the chunk before is added
    for (int v = static_cast<int>(threadIdx.x); v < n * kDim / 4; v += kQuantThreads) {
      cp_async_16(staged + 4 * v, sums + first_block * kDim + 4 * v, true);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    if (c < kDim) {
      for (int j = 0; j < n; ++j) total = __fadd_rn(total, staged[j * kDim + c]);
    }
  }
  if (c < kDim) job.mean[head * kDim + c] = __fdiv_rn(total, static_cast<float>(in.seq));
  if (threadIdx.x == 0) job.finished[head] = 0;  // ready for the next launch
}

// ---- INT8 codes with a scale per group ----

struct Int8Job {
  QuantGranularity granularity = QuantGranularity::per_warp;
  float pre_scale = 1.0f;
  const float* mean = nullptr;
  Int8Output out;
  int groups_per_block = 1;
};

// The rows of scale group `g` of a block (int8_groups_per_block of them): first, stride, count.
struct Int8Group {
  int first, stride, count;
};
template <bool kIsKey, int kRows>
__device__ __forceinline__ Int8Group int8_group(int g, QuantGranularity granularity) {
  if (!kIsKey && granularity == QuantGranularity::per_warp) return {g * kWarpQ, 1, kWarpQ};
  // Rows r and r + 8 of a warp tile: the rows one thread's MMA fragment holds.
  if (!kIsKey && granularity == QuantGranularity::per_thread) return {g / 8 * kWarpQ + g % 8, 8, 2};
  // Keys with equal index mod 8: the key columns one thread's fragment holds.
  if (kIsKey && granularity == QuantGranularity::per_thread) return {g, 8, kRows / 8};
  return {0, 1, kRows};
}
// The group that row `r` of a block belongs to.
template <bool kIsKey, int kRows>
__device__ __forceinline__ int int8_group_of(int r, QuantGranularity granularity) {
  if (!kIsKey && granularity == QuantGranularity::per_warp) return r / kWarpQ;
  if (!kIsKey && granularity == QuantGranularity::per_thread) return r / kWarpQ * 8 + r % 8;
  if (kIsKey && granularity == QuantGranularity::per_thread) return r % 8;
  return 0;
}

// Shared memory for the larger block (K's), so that Q's and K's blocks can share a launch.
template <int kDim>
struct Int8Shared {
  uint4 tile[kBlockK * kDim / 8];
  float row_amax[kBlockK];
  float mean[kDim];
};

// Where a block's row `row`, 16-byte vector `vector` lies in its staged tile: a row's vectors are
// permuted by (row, thread), so that the 8 threads of a quarter warp, which read 8 rows' or parts'
// vectors at once in int8_block_codes, hit 8 different bank groups.
template <int kDim, int kRows, int kThreads = kQuantThreads>
__device__ __forceinline__ int int8_slot(int row, int vector) {
  constexpr int kThreadsPerRow = kThreads / kRows;
  constexpr int kVectorsPerRow = kDim / 8, kVectorsPerThread = kDim / kThreadsPerRow / 8;
  return row * kVectorsPerRow + (vector ^ ((row * kThreadsPerRow + vector / kVectorsPerThread) & 7));
}

// Starts the copy of block `block` of rows (64 of Q, 128 of K) of (b, h) `head` into `tile` (as
// loaded, 16-bit, laid out by int8_slot); rows past the end are zeros. The caller commits and waits.
template <typename Elem, int kDim, int kRows, int kThreads = kQuantThreads>
__device__ __forceinline__ void stage_int8_block(const InputView& in, std::int64_t block, std::int64_t head,
                                                 uint4* tile) {
  constexpr int kVectorsPerRow = kDim / 8;
  const int h = static_cast<int>(head % in.heads), b = static_cast<int>(head / in.heads);
  for (int v = static_cast<int>(threadIdx.x); v < kRows * kVectorsPerRow; v += kThreads) {
    const int row = v / kVectorsPerRow, vector = v % kVectorsPerRow;
    const std::int64_t s = block * kRows + row;
    const bool valid = s < in.seq;
    cp_async_16(&tile[int8_slot<kDim, kRows, kThreads>(row, vector)],
                row_pointer<Elem>(in, b, h, valid ? s : 0) + vector * 8, valid);
  }
}

// The codes and group scales of a staged block (stage_int8_block), every group lying inside it;
// K's `mean` (kDim floats, zeros when unsmoothed) in shared memory. x is computed twice from the
// tile, once for the maxima and once for the codes, by the same operations: held in registers,
// K's 64 floats a thread kept a quarter of the warps resident (ncu). A thread's elements lie in
// one row: a row past the end (zeros as loaded, but K's less its mean) is left out of the maxima
// and coded 0 as a whole, rather than element by element. `row_amax` (kRows floats) may be reused
// once every thread has returned.
template <typename Elem, int kDim, int kRows, int kThreads = kQuantThreads>
__device__ __forceinline__ void int8_block_codes(const InputView& in, const Int8Job& job, std::int64_t block,
                                                 std::int64_t head, const uint4* tile, float* row_amax,
                                                 const float* mean) {
  constexpr int kThreadsPerRow = kThreads / kRows;
  constexpr int kPerThread = kDim / kThreadsPerRow;
  constexpr int kVectorsPerThread = kPerThread / 8;
  static_assert(kPerThread % 16 == 0, "whole 16-byte vectors of codes");
  constexpr bool kIsKey = kRows == kBlockK;  // Q is x = Q * pre_scale; K is x = K - mean (0: unsmoothed)
  const int r = static_cast<int>(threadIdx.x) / kThreadsPerRow;
  const int part = static_cast<int>(threadIdx.x) % kThreadsPerRow;
  const std::int64_t i = block * kRows + r;
  const int c0 = part * kPerThread;
  const bool inside = i < in.seq;
  auto vector_values = [&](int v, float (&x)[8]) {
    const uint4 raw = tile[int8_slot<kDim, kRows, kThreads>(r, part * kVectorsPerThread + v)];
    const Elem* e = reinterpret_cast<const Elem*>(&raw);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if constexpr (kIsKey) x[k] = __fsub_rn(to_float(e[k]), mean[c0 + v * 8 + k]);
      else x[k] = __fmul_rn(to_float(e[k]), job.pre_scale);
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
  if (!inside) amax = 0.0f;  // a row past the end belongs to no group
#pragma unroll
  for (int offset = 1; offset < kThreadsPerRow; offset *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  // A block that is one group (K's per_block and per_warp, Q's per_block) takes its maximum over
  // the warp by shuffles and then over the warps' maxima: every thread reading every row's maximum
  // was 128 shared loads a thread for K, more shared-memory issue than the tile itself. A maximum is
  // exact in any order.
  constexpr int kWarps = kThreads / 32;
  const bool whole_block = int8_groups_per_block(kIsKey, job.granularity) == 1;
  if (whole_block) {
#pragma unroll
    for (int offset = kThreadsPerRow; offset < 32; offset *= 2) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    }
    if (threadIdx.x % 32 == 0) row_amax[threadIdx.x / 32] = amax;
  } else if (part == 0) {
    row_amax[r] = amax;
  }
  __syncthreads();

  // This row's group's maximum, the loads eight ahead of the maxima: one by one, K's 128 rows were
  // 128 dependent shared loads (sage1-int8's preparation at Flux took 10 % longer, H100).
  const int g = int8_group_of<kIsKey, kRows>(r, job.granularity);
  const Int8Group group = int8_group<kIsKey, kRows>(g, job.granularity);
  float group_amax = 0.0f;
  if (whole_block) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) group_amax = fmaxf(group_amax, row_amax[w]);
  } else {
#pragma unroll 8
    for (int k = 0; k < group.count; ++k) group_amax = fmaxf(group_amax, row_amax[group.first + k * group.stride]);
  }
  const float inverse = group_amax == 0.0f ? 0.0f : __fdiv_rn(127.0f, group_amax);
  if (part == 0 && r == group.first) {
    job.out.scales[head * job.out.groups + block * job.groups_per_block + g] = __fdiv_rn(group_amax, 127.0f);
  }

  std::int8_t* dst = job.out.codes + (head * job.out.rows + i) * kDim + c0;
  const bool zeros = !inside || inverse == 0.0f;  // a row past the end, or a group of zeros
  // Each 16-byte vector of codes: code_of(x · inverse) has the code in its low byte.
  auto write_codes = [&](auto code_of) {
#pragma unroll
    for (int v = 0; v < kPerThread / 16; ++v) {
      std::uint32_t words[4] = {};
      if (!zeros) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float x[8];
          vector_values(v * 2 + half, x);
#pragma unroll
          for (int w = 0; w < 2; ++w) {
            std::uint32_t bits[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) bits[k] = code_of(__fmul_rn(x[4 * w + k], inverse));
            words[2 * half + w] = pack_low_bytes(bits[0], bits[1], bits[2], bits[3]);
          }
        }
      }
      reinterpret_cast<uint4*>(dst)[v] = uint4{words[0], words[1], words[2], words[3]};
    }
  };
  // |x| is at most the group's maximum, so x · inverse rounds to at most 127 in magnitude, unless
  // that maximum is below fp32's normal range and the inverse overflows: x · inverse is then ±inf,
  // which must clamp.
  if (inverse != INFINITY) {
    write_codes([](float y) { return int8_code_bits(y); });
  } else {
    write_codes([](float y) { return int8_code_bits_clamped(y); });
  }
}

// A CTA quantizes one block of rows of one (b, h), K's means read from the global memory.
template <typename Elem, int kDim, int kRows, int kThreads>
__device__ __forceinline__ void quantize_int8_block(const InputView& in, const Int8Job& job, std::int64_t block,
                                                    std::int64_t head, Int8Shared<kDim>& shared) {
  static_assert(kRows <= kBlockK, "the shared tile holds a K block");
  stage_int8_block<Elem, kDim, kRows, kThreads>(in, block, head, shared.tile);
  cp_async_commit();
  // K's means come from the kernel before; Q's and unsmoothed K's blocks read the uploaded inputs
  // only, and go on while it finishes.
  if (job.mean) wait_for_prior_kernel();
  if constexpr (kRows == kBlockK) {
    for (int c = static_cast<int>(threadIdx.x); c < kDim; c += kThreads) {
      shared.mean[c] = job.mean ? job.mean[head * kDim + c] : 0.0f;  // x - 0 is x, -0 and NaN included
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  int8_block_codes<Elem, kDim, kRows, kThreads>(in, job, block, head, shared.tile, shared.row_amax, shared.mean);
}

// One CTA a block of one target's (b, h), the targets' CTAs in their order.
// Six CTAs of 256 threads an SM, as many as the shared tiles allow for K's blocks at head dim 128
// (40 registers, a few bytes spilled): faster than the five that 48 registers allowed on
// 4x32x4096x128, within 1 µs of them on the short shapes (H100). At head dim 64, eight (32
// registers) were 1 % slower at CogVideoX (bench/results/experiments.md: 2026-11-26-h100-int8-keys-eight-an-sm).
// Q's blocks at d64 (8 kB) run in CTAs of 128 threads instead, twelve an SM (quantize_int8 says why).
template <typename Elem, int kDim, int kThreads>
__global__ void __launch_bounds__(kThreads, 6 * kQuantThreads / kThreads)
    quantize_int8_kernel(const LaunchTargets<Int8Target, 2> targets, QuantGranularity granularity) {
  __shared__ Int8Shared<kDim> shared;
  let_next_kernel_start();
  const std::int64_t cta = blockIdx.x;
  const int target = targets.of(cta);
  const Int8Target& t = targets.target[target];
  const Int8Job job{granularity, t.pre_scale, t.mean, t.out, int8_groups_per_block(t.is_key, granularity)};
  std::int64_t local = cta - targets.first[target];
  // After channel_means, K's blocks run in reverse order: the first then read the heads that the
  // means read last, part of which L2 still holds. That took 1.5 % off the Sage kinds'
  // preparation at CogVideoX and 1 % at 2x24x4250x64, side by side (H100,
  // bench/results/experiments.md: 2026-11-26-h100-key-codes-reversed).
  if (t.is_key && t.mean) local = targets.first[target + 1] - targets.first[target] - 1 - local;
  const std::int64_t blocks = t.out.rows / (t.is_key ? kBlockK : kBlockQ);
  if (t.is_key) quantize_int8_block<Elem, kDim, kBlockK, kThreads>(t.in, job, local % blocks, local / blocks, shared);
  else quantize_int8_block<Elem, kDim, kBlockQ, kThreads>(t.in, job, local % blocks, local / blocks, shared);
  complete_after_prior_kernel();
}

// ---- max |x| ----

template <typename Elem, int kDim>
__global__ void __launch_bounds__(kQuantThreads) abs_max_kernel(const LaunchTargets<MaxTarget, 3> targets,
                                                                bool per_channel, bool per_tensor) {
  constexpr int kRowsAPass = kQuantThreads / (kDim / 8);
  __shared__ float partial[kRowsAPass][kDim];
  // This CTA's input, and its block of keys and head there.
  const std::int64_t cta = blockIdx.x;
  const int target = targets.of(cta);
  const InputView& in = targets.target[target].in;
  unsigned* amax = targets.target[target].amax;
  const std::int64_t blocks = (in.seq + kMaxKeys - 1) / kMaxKeys;
  const std::int64_t local = cta - targets.first[target];
  const std::int64_t head = local / blocks;
  const int h = static_cast<int>(head % in.heads), b = static_cast<int>(head / in.heads);
  const std::int64_t first = local % blocks * kMaxKeys;
  let_next_kernel_start();
  row_maxima<Elem, kDim>(in, b, h, first, min(in.seq, first + kMaxKeys), partial);
  // It reads the uploaded inputs only; the maxima it adds into were zeroed before the chain began.
  complete_after_prior_kernel();
  __syncthreads();
  // max is exact in any order: atomics across CTAs change nothing.
  if (per_channel) {
    const int c = static_cast<int>(threadIdx.x);
    if (c < kDim) atomicMax(amax + head * kDim + c, __float_as_uint(channel_max(partial, c)));
  } else if (threadIdx.x < 32) {
    float all = 0.0f;
    for (int k = static_cast<int>(threadIdx.x); k < kRowsAPass * kDim; k += 32) all = fmaxf(all, (&partial[0][0])[k]);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) all = fmaxf(all, __shfl_xor_sync(0xffffffffu, all, offset));
    if (threadIdx.x == 0) atomicMax(amax + (per_tensor ? 0 : head), __float_as_uint(all));
  }
}

// ---- FP8 ----

// Sixteen values times `inverse` as e4m3 codes, value 0 in the lowest byte; all 0 when inverse is 0
// (an all-zero head or channel, or one whose maximum a NaN hid). Pairs go through one cvt each.
__device__ __forceinline__ uint4 fp8_codes(const float (&x)[16], float inverse) {
  if (inverse == 0.0f) return make_uint4(0, 0, 0, 0);
  float y[16];
#pragma unroll
  for (int k = 0; k < 16; ++k) y[k] = __fmul_rn(x[k], inverse);
  return make_uint4(pack_e4m3x4(y[0], y[1], y[2], y[3]), pack_e4m3x4(y[4], y[5], y[6], y[7]),
                    pack_e4m3x4(y[8], y[9], y[10], y[11]), pack_e4m3x4(y[12], y[13], y[14], y[15]));
}

// Maximum `index` as the scale that multiplies back (amax / target) and the inverse that the codes
// multiply by (target / amax, 0 for 0), each divided once, as the emulation divides them.
struct Fp8Factors {
  float scale, inverse;
};
__device__ __forceinline__ Fp8Factors fp8_factors(float amax, float target) {
  return {__fdiv_rn(amax, target), amax == 0.0f ? 0.0f : __fdiv_rn(target, amax)};
}
__device__ __forceinline__ Fp8Factors fp8_factors(const Fp8Scales& s, std::int64_t index) {
  return fp8_factors(__uint_as_float(s.amax[index]), s.target);
}

// A row's sixteen 16-bit elements, as two raw vectors, as e4m3 codes (fp8_codes).
template <typename Elem>
__device__ __forceinline__ uint4 row_codes(const uint4 (&raw)[2], float inverse) {
  const Elem* e = reinterpret_cast<const Elem*>(raw);
  float x[16];
#pragma unroll
  for (int k = 0; k < 16; ++k) x[k] = to_float(e[k]);
  return fp8_codes(x, inverse);
}

template <typename Elem>
__global__ void quantize_fp8_rows_kernel(const LaunchTargets<RowsTarget, 2> targets) {
  let_next_kernel_start();
  bool waited = false;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < targets.first[targets.count]; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int target = targets.of(i);
    const RowsTarget& t = targets.target[target];
    const InputView& in = t.in;
    const std::int64_t local = i - targets.first[target];
    const int vectors_per_row = in.head_dim / 16;  // 16 codes a vector
    const int vector = static_cast<int>(local % vectors_per_row);
    const std::int64_t row = local / vectors_per_row;
    const std::int64_t s = row % t.rows, head = row / t.rows;
    // The 16 elements stay packed across the wait: as floats they took 42 registers, a CTA an SM.
    uint4 raw[2] = {};
    if (s < in.seq) {
      const Elem* src = row_pointer<Elem>(in, head / in.heads, head % in.heads, s) + vector * 16;
      raw[0] = reinterpret_cast<const uint4*>(src)[0], raw[1] = reinterpret_cast<const uint4*>(src)[1];
    }
    if (!waited) wait_for_prior_kernel(), waited = true;  // for the maxima
    const Fp8Factors factors = fp8_factors(t.scales, t.scales.per_tensor ? 0 : head);
    if (s == 0 && vector == 0) t.scales.scales[head] = factors.scale;
    reinterpret_cast<uint4*>(t.out)[local] = s < in.seq ? row_codes<Elem>(raw, factors.inverse) : make_uint4(0, 0, 0, 0);
  }
}

// The key a position of V's permuted 32-key chunk holds: position p = 4 t + e of the lower or upper
// 16 is what lane-column t's A-fragment byte e of P is, keys 2t, 2t + 1, 8 + 2t, 9 + 2t (+ 16).
__device__ __forceinline__ int permuted_key(int p) {
  return (p & 16) | (((p >> 1) & 1) << 3) | (((p >> 2) & 3) << 1) | (p & 1);
}

// Where channel c of `key` lies in a staged tile of V (as loaded, kDim elements a key): the
// columns are swizzled by the key's 16-key group, since the transposing write loop's warp reads 8
// groups' keys at once, which a padded pitch still put in one bank (8-way conflicts, ncu). Eight
// channels from a multiple of 8 stay together.
__device__ __forceinline__ int swizzled(int key, int c) { return c ^ (((key >> 4) & 7) << 3); }

// Channel c of a permuted 32-key chunk's 16-key group `group` (0 to 7 in a tile of kBlockK keys)
// as 16 e4m3 codes, from a tile staged with swizzled(); keys past the sequence are zeros there.
template <typename Elem, int kDim>
__device__ __forceinline__ uint4 transposed_codes(const Elem (*tile)[kDim], int group, int c, float inverse) {
  // Position k of the group holds key group * 16 + permuted_key(k) (the group's parity is the
  // chunk's upper or lower 16), so the column's swizzle is the group's and each read's offset a
  // constant.
  const Elem* column = &tile[group * 16][swizzled(group * 16, c)];
  float x[16];
#pragma unroll
  for (int k = 0; k < 16; ++k) x[k] = to_float(column[permuted_key(k) * kDim]);
  return fp8_codes(x, inverse);
}

template <typename Elem, int kDim>
__global__ void __launch_bounds__(kQuantThreads) quantize_fp8_values_kernel(const InputView in, const Fp8Scales scales,
                                                                            std::uint8_t* out, std::int64_t keys) {
  __shared__ __align__(16) Elem tile[kBlockK][kDim];
  const std::int64_t key0 = static_cast<std::int64_t>(blockIdx.x) * kBlockK;
  const int h = static_cast<int>(blockIdx.y), b = static_cast<int>(blockIdx.z);
  const std::int64_t head = static_cast<std::int64_t>(b) * in.heads + h;
  constexpr int kVectors = kDim / 8;
  let_next_kernel_start();
  for (int v = static_cast<int>(threadIdx.x); v < kBlockK * kVectors; v += kQuantThreads) {
    const int row = v / kVectors, column = (v % kVectors) * 8;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (key0 + row < in.seq) value = *reinterpret_cast<const uint4*>(row_pointer<Elem>(in, b, h, key0 + row) + column);
    *reinterpret_cast<uint4*>(&tile[row][swizzled(row, column)]) = value;
  }
  wait_for_prior_kernel();  // for the maxima
  __syncthreads();
  // Out: a channel's 128 keys are 8 vectors of 16 codes.
  for (int item = static_cast<int>(threadIdx.x); item < kDim * 8; item += kQuantThreads) {
    const int c = item / 8, group = item % 8;
    const std::int64_t index = scales.per_channel ? head * kDim + c : scales.per_tensor ? 0 : head;
    const Fp8Factors factors = fp8_factors(scales, index);
    if (blockIdx.x == 0 && group == 0 && (scales.per_channel || c == 0)) {
      scales.scales[scales.per_channel ? head * kDim + c : head] = factors.scale;
    }
    *reinterpret_cast<uint4*>(out + (head * kDim + c) * keys + key0 + group * 16) =
        transposed_codes<Elem, kDim>(tile, group, c, factors.inverse);
  }
}

// ---- Whole heads in a cluster ----

// 16 CTAs a cluster where the device schedules them (a non-portable size, H100's), else 8. Each
// kernel is allowed its dynamic shared memory and the cluster size as it is first asked.
template <auto kKernel, std::size_t kDynamicBytes>
unsigned max_head_cluster() {
  static const unsigned largest = [] {
    ATTNREPLAY_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(kDynamicBytes)));
    if (cudaFuncSetAttribute(kKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
      (void)cudaGetLastError();
      return 8u;
    }
    return max_active_clusters(kKernel, 16, kQuantThreads, kDynamicBytes) > 0 ? 16u : 8u;
  }();
  return largest;
}

// ---- Groups of CTAs that hold a head and meet in the global memory ----

// Where a cluster cannot hold a head, a group of CTAs does: consecutive places of a launch, taken
// from a counter in the order the CTAs start. A CTA only waits on CTAs that have started, or that
// start in the slots the heads before it free: no deadlock while a head's CTAs fit in the GPU at
// once (the plans ask for half). The counters are zeroed before the first launch; each launch
// leaves them zeroed.
struct GroupCounters {
  unsigned* arrived = nullptr;   // per head: CTAs whose share is in
  unsigned* departed = nullptr;  // per head: CTAs that have read the head's
  unsigned* places = nullptr;    // [0]: the next CTA's place in the launch, [1]: CTAs finished
  unsigned ctas_per_head = 0;
};
// A group launch's work, in 4-byte words: the heads' shares (`share_words` a head: the FP8 maxima as
// bits, or K's block sums as floats), then each head's two counters, then the two places.
static_assert(sizeof(float) == sizeof(unsigned));
inline std::size_t group_work_bytes(std::int64_t heads, std::int64_t share_words) {
  return static_cast<std::size_t>(heads * (share_words + 2) + 2) * sizeof(unsigned);
}
// The counters of such a work.
inline GroupCounters group_counters(void* work, std::int64_t heads, std::int64_t share_words, unsigned ctas_per_head) {
  unsigned* words = static_cast<unsigned*>(work) + heads * share_words;
  return {words, words + heads, words + 2 * heads, ctas_per_head};
}
// This CTA's place. All threads call it; `word` is a shared word.
__device__ __forceinline__ std::int64_t take_group_place(const GroupCounters& g, unsigned& word) {
  if (threadIdx.x == 0) word = atomicAdd(g.places, 1u);
  __syncthreads();
  return word;
}
// After the CTA's share is written: counts it in and returns once the head's CTAs all have. All
// threads call it. Thread 0 alone releases the CTA's writes (the barrier orders them before its
// release) and acquires the others', as cooperative_groups' grid sync does: a fence in every thread
// (__threadfence, MEMBAR.SC.GPU) made the preparation 2-8 % slower at 4x32x16384x128 and up to 5 %
// at CogVideoX (H100, bench/results/experiments.md: 2026-11-26-h100-group-fence).
__device__ __forceinline__ void meet_group(const GroupCounters& g, std::int64_t head) {
  __syncthreads();
  if (threadIdx.x == 0) {
    cuda::atomic_ref<unsigned, cuda::thread_scope_device> arrived(g.arrived[head]);
    arrived.fetch_add(1u, cuda::memory_order_release);
    while (arrived.load(cuda::memory_order_acquire) < g.ctas_per_head) __nanosleep(128);
  }
  __syncthreads();
}
// After the CTA has read the head's shares: true, in all threads, for the head's last reader, which
// zeroes the head's counters and may clear its shares. `word` is a shared word.
__device__ __forceinline__ bool leave_group(const GroupCounters& g, std::int64_t head, unsigned& word) {
  __syncthreads();
  if (threadIdx.x == 0) {
    word = atomicAdd(g.departed + head, 1u) == g.ctas_per_head - 1;
    if (word) g.arrived[head] = 0, g.departed[head] = 0;
  }
  __syncthreads();
  return word != 0;
}
// At the CTA's end: the launch's last CTA frees the places for the next launch.
__device__ __forceinline__ void release_group_place(const GroupCounters& g) {
  if (threadIdx.x == 0 && atomicAdd(g.places + 1, 1u) == gridDim.x - 1) g.places[0] = 0, g.places[1] = 0;
}

// ---- FP8 from one read: a cluster or a group of CTAs holds a head ----

// FP8 heads' groups: the maxima, per head and channel, as bits; zeroed like the counters.
struct HeadGroups {
  unsigned* amax = nullptr;
  GroupCounters counters;
};

// The small shared arrays of a CTA of FP8 heads. `cta_max`: this CTA's maxima, per channel, as bits
// (a non-negative float's bits order as it does), pushed to the cluster's CTAs. (Maxima per warp took
// 4 kB more: at Flux, three CTAs an SM would not fit.)
template <int kDim>
struct Fp8HeadShared {
  std::uint64_t maxima_in;  // in a cluster: counts the bytes of maxima the cluster's CTAs push here
  unsigned cta_max[kDim];
  float head_max[kDim];  // the head's, per channel (in a cluster, the pushed maxima's bits)
  float inverse[kDim];   // what the codes multiply by, per channel (all equal per head)
  unsigned word;         // a group's place, then whether the CTA is its head's last reader
};

// A cluster of CTAs (kInCluster), or a group of CTAs that meet in the global memory, holds one
// (b, h) of one input, `rows_per_cta` rows a CTA (a multiple of 16), staged with swizzled(). Each
// CTA takes its rows' per-channel maxima, reads the head's, and codes its rows from the tiles:
// the input is read once. Cluster or group, the maxima and codes are the same, bit for bit.
// `place`: the CTA's, in the cluster's or group's order.
// In a cluster each CTA pushes its maxima into every CTA's head_max (remote atomic max, counted on
// that CTA's mbarrier), so the cluster meets once, at the start, before any write. When each CTA
// read the others' maxima instead, two cluster barriers stood between its loads and its codes, each
// releasing (on sm_90 a GPU-scope memory barrier: "Stall Membar", 15 % of the warps' stalls at
// Flux), and a CTA could not leave before all had read its maxima. Pushed, fa3-fp8's preparation
// took 4.5-10 % less at Flux, 4x32x1024x128, 4x32x4096x128 and 2x24x4250x64 (H100,
// bench/results/experiments.md: 2026-11-26-h100-pushed-maxima).
// A CTA stages its first `staged_per_cta` rows in the tile and holds the rest in registers (at most
// kHeldVectors 16-byte vectors a thread), which it copies into the tile once the staged rows are
// coded: fp8_cluster_plan says where.
template <typename Elem, int kDim, bool kInCluster, int kHeldVectors = 0>
__device__ __forceinline__ void fp8_head_rows(const LaunchTargets<HeadTarget, 3>& targets, int rows_per_cta,
                                              int staged_per_cta, const HeadGroups& groups, std::int64_t place,
                                              Elem (*rows_staged)[kDim], Fp8HeadShared<kDim>& shared) {
  constexpr int kVectors = kDim / 8;
  constexpr int kRowsAPass = kQuantThreads / kVectors;
  unsigned* cta_max = shared.cta_max;
  float* head_max = shared.head_max;
  float* inverse = shared.inverse;
  unsigned& shared_word = shared.word;
  const unsigned ctas_per_head =
      kInCluster ? cooperative_groups::this_cluster().num_blocks() : groups.counters.ctas_per_head;
  const int rank = static_cast<int>(place % ctas_per_head);
  const std::int64_t index = place / ctas_per_head;  // of the (target, head)
  const int which = targets.of(index);
  const HeadTarget& t = targets.target[which];
  const InputView& in = t.in;
  const std::int64_t head = index - targets.first[which];
  const int h = static_cast<int>(head % in.heads), b = static_cast<int>(head / in.heads);
  const std::int64_t row0 = static_cast<std::int64_t>(rank) * rows_per_cta;
  const int rows = static_cast<int>(max(std::int64_t{0}, min(std::int64_t{rows_per_cta}, t.rows - row0)));
  let_next_kernel_start();
  const int c = static_cast<int>(threadIdx.x);
  // A cluster of one (a head of one tile) is not launched as a cluster, and has nothing to exchange.
  const bool exchange = kInCluster && ctas_per_head > 1;
  if (exchange) {
    if (c < kDim) {
      head_max[c] = 0.0f;          // the pushed maxima's bits: max as unsigned
      fence_proxy_async_shared();  // the pushes are the async proxy's
    }
    if (c == 0) {
      mbarrier_init(&shared.maxima_in, 1);
      mbarrier_arrive_expect_bytes(&shared.maxima_in, static_cast<int>(ctas_per_head * kDim * sizeof(unsigned)));
      fence_mbarrier_init();
    }
    // The zeros and the mbarrier, released before any CTA pushes (on sm_90 the arrive's release is
    // the cluster's one GPU-scope memory barrier).
    __cluster_barrier_arrive();
  }
  const int staged = min(rows, staged_per_cta);
  for (int v = static_cast<int>(threadIdx.x); v < staged * kVectors; v += kQuantThreads) {
    const int row = v / kVectors, column = (v % kVectors) * 8;
    const bool valid = row0 + row < in.seq;
    cp_async_16(&rows_staged[row][swizzled(row, column)], row_pointer<Elem>(in, b, h, valid ? row0 + row : 0) + column,
                valid);
  }
  cp_async_commit();
  // The held rows, vector v of them in thread v % kQuantThreads; zeros past the end, as staged.
  uint4 held[kHeldVectors > 0 ? kHeldVectors : 1];
#pragma unroll
  for (int j = 0; j < kHeldVectors; ++j) {
    const int v = static_cast<int>(threadIdx.x) + j * kQuantThreads;
    const int row = staged + v / kVectors, column = (v % kVectors) * 8;
    held[j] = make_uint4(0, 0, 0, 0);
    if (row < rows && row0 + row < in.seq) {
      held[j] = __ldcg(reinterpret_cast<const uint4*>(row_pointer<Elem>(in, b, h, row0 + row) + column));
    }
  }
  if (c < kDim) cta_max[c] = 0;
  cp_async_wait<0>();
  __syncthreads();

  // Per-channel maxima: a thread's 8 channels over every kRowsAPass-th row, then over the lanes
  // with the same channels (lane % kVectors), then over the warps. Rows past the end are zeros.
  const int vector = static_cast<int>(threadIdx.x) % kVectors;
  float m[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int row = static_cast<int>(threadIdx.x) / kVectors; row < staged; row += kRowsAPass) {
    const uint4 raw = *reinterpret_cast<const uint4*>(&rows_staged[row][swizzled(row, vector * 8)]);
    const Elem* e = reinterpret_cast<const Elem*>(&raw);
#pragma unroll
    for (int k = 0; k < 8; ++k) m[k] = fmaxf(m[k], fabsf(to_float(e[k])));
  }
  // A held vector has the same channels as the staged ones this thread read: v % kVectors.
#pragma unroll
  for (int j = 0; j < kHeldVectors; ++j) {
    const Elem* e = reinterpret_cast<const Elem*>(&held[j]);
#pragma unroll
    for (int k = 0; k < 8; ++k) m[k] = fmaxf(m[k], fabsf(to_float(e[k])));
  }
#pragma unroll
  for (int offset = kVectors; offset < 32; offset *= 2) {
#pragma unroll
    for (int k = 0; k < 8; ++k) m[k] = fmaxf(m[k], __shfl_xor_sync(0xffffffffu, m[k], offset));
  }
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (lane < kVectors) {
#pragma unroll
    for (int k = 0; k < 8; ++k) atomicMax(&cta_max[vector * 8 + k], __float_as_uint(m[k]));  // m[k] >= +0
  }
  // max is exact in any order: the head's maxima are abs_max's, bit for bit.
  if constexpr (kInCluster) {
    __syncthreads();  // cta_max complete
    if (!exchange) {
      if (c < kDim) head_max[c] = __uint_as_float(cta_max[c]);
    } else {
      __cluster_barrier_wait();  // every CTA's head_max zeroed and mbarrier set
      if (c < kDim) {
        const unsigned mine = cta_max[c];
        for (unsigned r = 0; r < ctas_per_head; ++r) {
          cluster_max_into(reinterpret_cast<unsigned*>(&head_max[c]), &shared.maxima_in, r, mine);
        }
      }
      mbarrier_wait(&shared.maxima_in, 0);  // all the cluster's maxima in
    }
  } else {
    unsigned* head_amax = groups.amax + index * kDim;
    __syncthreads();  // cta_max complete
    if (c < kDim) atomicMax(head_amax + c, cta_max[c]);
    meet_group(groups.counters, index);
    if (c < kDim) head_max[c] = __uint_as_float(__ldcg(head_amax + c));  // from L2: other CTAs' atomics
    if (leave_group(groups.counters, index, shared_word) && c < kDim) head_amax[c] = 0;  // for the next launch
  }
  __syncthreads();
  if (!t.per_channel && warp == 0) {
    float all = 0.0f;
    for (int k = lane; k < kDim; k += 32) all = fmaxf(all, head_max[k]);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) all = fmaxf(all, __shfl_xor_sync(0xffffffffu, all, offset));
    if (lane == 0) head_max[0] = all;
  }
  __syncthreads();
  if (c < kDim) {
    const Fp8Factors factors = fp8_factors(head_max[t.per_channel ? c : 0], t.target);
    inverse[c] = factors.inverse;
    if (rank == 0 && (t.per_channel || c == 0)) t.scales[t.per_channel ? head * kDim + c : head] = factors.scale;
  }
  __syncthreads();

  // The codes of the tile's first `count` rows, rows first_row... of the CTA's.
  const auto write_codes = [&](int count, std::int64_t first_row) {
    if (t.values) {
      // Out: a channel's 16-key groups are vectors of 16 codes, as quantize_fp8_values_kernel writes
      // them. Items go channel by channel through runs of up to 8 groups, 128 keys, as that kernel's
      // do: the run's reads then fall in different banks.
      const int groups = count / 16;
      for (int item = static_cast<int>(threadIdx.x); item < groups * kDim; item += kQuantThreads) {
        const int run = item / (kDim * 8), in_run = min(8, groups - run * 8), rest = item - run * kDim * 8;
        const int channel = rest / in_run, group = run * 8 + rest % in_run;
        *reinterpret_cast<uint4*>(t.out + (head * kDim + channel) * t.rows + first_row + group * 16) =
            transposed_codes<Elem, kDim>(rows_staged, group, channel, inverse[channel]);
      }
    } else {
      // Out: rows as loaded, 16 codes a vector, as quantize_fp8_rows_kernel.
      for (int item = static_cast<int>(threadIdx.x); item < count * (kDim / 16); item += kQuantThreads) {
        const int row = item / (kDim / 16), c0 = item % (kDim / 16) * 16;
        const uint4 raw[2] = {*reinterpret_cast<const uint4*>(&rows_staged[row][swizzled(row, c0)]),
                              *reinterpret_cast<const uint4*>(&rows_staged[row][swizzled(row, c0 + 8)])};
        *reinterpret_cast<uint4*>(t.out + (head * t.rows + first_row + row) * kDim + c0) =
            row_codes<Elem>(raw, inverse[0]);
      }
    }
  };
  write_codes(staged, row0);
  if (kHeldVectors > 0 && rows > staged) {  // alike in all the CTA's threads
    __syncthreads();  // the staged rows' codes are read
#pragma unroll
    for (int j = 0; j < kHeldVectors; ++j) {
      const int v = static_cast<int>(threadIdx.x) + j * kQuantThreads;
      const int row = v / kVectors, column = (v % kVectors) * 8;
      if (row < rows - staged) *reinterpret_cast<uint4*>(&rows_staged[row][swizzled(row, column)]) = held[j];
    }
    __syncthreads();
    write_codes(rows - staged, row0 + staged);  // staged is a whole number of 16-key groups
  }
}

// With held rows, at most 64 registers: four CTAs an SM.
template <typename Elem, int kDim, bool kInCluster, int kHeldVectors = 0>
__global__ void __launch_bounds__(kQuantThreads, kHeldVectors > 0 ? 4 : 0)
    quantize_fp8_heads_kernel(const LaunchTargets<HeadTarget, 3> targets, int rows_per_cta, int staged_per_cta,
                              const HeadGroups groups) {
  // The tiles start on a 128-byte boundary, whatever the static arrays' size: 16 bytes past one
  // (after 3c14a66 added a word to them), the copies into them read each sector from L2 twice, and
  // fa3-fp8's preparation took 12-16 % longer at Flux and 4x32x4096x128 and 6-9 % on the suite's
  // other shapes (H100, bench/results/experiments.md: 2026-11-26-h100-tile-alignment and -tile-skew-ncu/).
  extern __shared__ __align__(128) uint4 dynamic_shared[];
  __shared__ Fp8HeadShared<kDim> shared;
  std::int64_t place = blockIdx.x;
  if constexpr (!kInCluster) place = take_group_place(groups.counters, shared.word);
  fp8_head_rows<Elem, kDim, kInCluster, kHeldVectors>(targets, rows_per_cta, staged_per_cta, groups, place,
                                                      reinterpret_cast<Elem (*)[kDim]>(dynamic_shared), shared);
  if constexpr (!kInCluster) release_group_place(groups.counters);
  complete_after_prior_kernel();  // it reads the uploaded inputs only
}

// ---- K's means and INT8 codes from one read: a cluster or a group of CTAs holds a head ----

// sage1-int8's Q blocks, coded in the launch of K's groups by CTAs of their own (`ctas` of them).
struct QueryBlocks {
  Int8Target target;
  std::int64_t ctas = 0;
};

// sage2-int8-fp8's V heads, coded in the launch of K's groups by groups of their own, as
// quantize_fp8_heads_kernel's groups code them, a 128-key block a CTA (`ctas` of them).
struct ValueHeads {
  LaunchTargets<HeadTarget, 3> targets;
  HeadGroups groups;
  std::int64_t ctas = 0;
};

// K's heads' groups: each block's sums, per (head, block) and channel.
struct KeyGroups {
  float* block_sums = nullptr;
  GroupCounters counters;
  std::int64_t key_span = 0;  // K's places are spread over the launch's first key_span places
};

// A cluster of CTAs (kInCluster), or a group of CTAs that meet in the global memory, holds one
// (b, h) of K, a block of kBlockK keys a CTA, staged as quantize_int8_kernel stages one. Each CTA
// sums its block's keys per channel as channel_mean_kernel does and adds the blocks' sums in block
// order, from the cluster's shared memory (distributed) or the global memory: each has the head's
// means, bit for bit channel_means', and codes its block with them. K is read once, where
// channel_means and quantize_int8 read it twice. A group launch may also code Q's blocks
// (`queries`) or V's heads (`values`) in CTAs between K's. Against a launch after K's, that took
// sage1-int8's preparation 6 % less at Flux, 9 % at 4x32x4096x128 and 1 % at 4x32x16384x128, and
// sage2-int8-fp8's 9 %, 7 % and 3 % (H100, bench/results/experiments.md: 2026-11-26-h100-between-key-groups).
// Groups: six CTAs an SM (40 registers). At four (64 registers, 32 block sums in flight) the
// waiting CTAs held the SMs; six took 4-6 % off the preparation at Flux, 7-8 % at 4x32x4096x128
// and 13-18 % at 4x32x16384x128 (H100, bench/results/experiments.md: 2026-11-26-h100-key-group-registers).
// Clusters: the compiler's choice (0), 40 registers at head dim 128 and 32 at 64.
template <typename Elem, int kDim, bool kInCluster>
__global__ void __launch_bounds__(kQuantThreads, kInCluster ? 0 : 6)
    quantize_int8_key_heads_kernel(const InputView in, const Int8Job job, const KeyGroups groups,
                                   const QueryBlocks queries, const ValueHeads values) {
  namespace cg = cooperative_groups;
  __shared__ Int8Shared<kDim> shared;
  __shared__ Fp8HeadShared<kDim> value_shared;
  __shared__ float block_sums[kDim];  // the cluster reads them
  __shared__ unsigned shared_word;
  std::int64_t place = blockIdx.x;
  unsigned blocks = groups.counters.ctas_per_head;
  if constexpr (kInCluster) {
    blocks = cg::this_cluster().num_blocks();
  } else {
    place = take_group_place(groups.counters, shared_word);
    // Q's blocks or V's heads take places spread evenly between K's, so that they work while K's
    // CTAs wait for their heads: a place is K's where the count of K's places up to it steps.
    // K's places and V's stay in start order, so at most one head of each waits for CTAs that
    // have not started, and the launch cannot deadlock while two heads fit in the GPU at once
    // (int8_key_group asks for that). Q's CTAs never wait. K's places are spread over the first
    // key_span places only; the places after them are Q's (launch_int8_key_heads says why).
    if (queries.ctas + values.ctas > 0) {
      const std::int64_t key_ctas = gridDim.x - queries.ctas - values.ctas;
      const std::int64_t keys_before = place < groups.key_span ? place * key_ctas / groups.key_span : key_ctas;
      if (place >= groups.key_span || (place + 1) * key_ctas / groups.key_span == keys_before) {
        const std::int64_t local = place - keys_before;
        if (queries.ctas > 0) {
          let_next_kernel_start();
          const Int8Target& q = queries.target;
          const Int8Job q_job{job.granularity, q.pre_scale, nullptr, q.out,
                              int8_groups_per_block(false, job.granularity)};
          const std::int64_t q_blocks = q.out.rows / kBlockQ;
          quantize_int8_block<Elem, kDim, kBlockQ, kQuantThreads>(q.in, q_job, local % q_blocks, local / q_blocks,
                                                                  shared);
        } else {
          fp8_head_rows<Elem, kDim, false>(values.targets, kBlockK, kBlockK, values.groups, local,
                                           reinterpret_cast<Elem (*)[kDim]>(shared.tile), value_shared);
        }
        release_group_place(groups.counters);
        complete_after_prior_kernel();
        return;
      }
      place = keys_before;
    }
  }
  const std::int64_t block = place % blocks;
  const std::int64_t head = place / blocks;
  let_next_kernel_start();
  stage_int8_block<Elem, kDim, kBlockK>(in, block, head, shared.tile);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  const int c = static_cast<int>(threadIdx.x);
  float sum = 0.0f;
  if (c < kDim) {
    const int keys = static_cast<int>(min(static_cast<std::int64_t>(kBlockK), in.seq - block * kBlockK));
    sum = sum_in_order(keys, [&](int j) {
      return to_float(reinterpret_cast<const Elem*>(&shared.tile[int8_slot<kDim, kBlockK>(j, c / 8)])[c % 8]);
    });
  }
  [[maybe_unused]] cg::cluster_group::arrival_token all_read;
  if constexpr (kInCluster) {
    const cg::cluster_group cluster = cg::this_cluster();
    if (c < kDim) block_sums[c] = sum;
    cluster.sync();  // every CTA's block sums written and visible
    if (c < kDim) {
      const float total = sum_in_order(blocks, [&](unsigned j) { return cluster.map_shared_rank(block_sums, j)[c]; });
      shared.mean[c] = __fdiv_rn(total, static_cast<float>(in.seq));
    }
    // The cluster's CTAs may leave once all have read block_sums: the wait is at the end.
    all_read = cluster.barrier_arrive();
  } else {
    float* head_sums = groups.block_sums + head * blocks * kDim;
    if (c < kDim) head_sums[block * kDim + c] = sum;
    meet_group(groups.counters, head);
    if (c < kDim) {
      // From L2 (__ldcg): other CTAs wrote them. 16 loads in flight: a round trip to L2 for every
      // 16 of the head's blocks, in the 40 registers that six CTAs an SM leave (32 spill there; 8
      // were 3 % slower at 4x32x16384x128, H100, bench/results/experiments.md: 2026-11-26-h100-key-group-registers).
      const float total = sum_in_order<16>(blocks, [&](unsigned j) { return __ldcg(head_sums + j * kDim + c); });
      shared.mean[c] = __fdiv_rn(total, static_cast<float>(in.seq));
    }
    leave_group(groups.counters, head, shared_word);  // the sums are written anew by each launch
  }
  __syncthreads();
  int8_block_codes<Elem, kDim, kBlockK>(in, job, block, head, shared.tile, shared.row_amax, shared.mean);
  if constexpr (kInCluster) cg::this_cluster().barrier_wait(std::move(all_read));
  else release_group_place(groups.counters);
  complete_after_prior_kernel();  // it reads the uploaded inputs only
}

// Runs LAUNCH with Elem and kDim naming the view's element type and head dim (C++17: no
// templated lambdas).
#define ATTNREPLAY_FOR_ELEMENT_AND_DIM(view, LAUNCH)                                                      \
  do {                                                                                                 \
    const bool bf16_ = (view).element == Element::bf16;                                                \
    if ((view).head_dim == 64 && bf16_) {                                                              \
      using Elem = __nv_bfloat16;                                                                      \
      constexpr int kDim = 64;                                                                         \
      LAUNCH;                                                                                          \
    } else if ((view).head_dim == 64) {                                                                \
      using Elem = __half;                                                                             \
      constexpr int kDim = 64;                                                                         \
      LAUNCH;                                                                                          \
    } else if ((view).head_dim == 128 && bf16_) {                                                      \
      using Elem = __nv_bfloat16;                                                                      \
      constexpr int kDim = 128;                                                                        \
      LAUNCH;                                                                                          \
    } else if ((view).head_dim == 128) {                                                               \
      using Elem = __half;                                                                             \
      constexpr int kDim = 128;                                                                        \
      LAUNCH;                                                                                          \
    } else {                                                                                           \
      throw std::invalid_argument("quantization: head dim " + std::to_string((view).head_dim) +        \
                                  " (64 or 128 only)");                                                \
    }                                                                                                  \
  } while (false)

dim3 head_grid(std::int64_t blocks, const InputView& in) {
  return dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(in.heads), static_cast<unsigned>(in.batch));
}

// The launch targets of FP8 heads, a cluster or group a head, each target checked.
LaunchTargets<HeadTarget, 3> fp8_head_targets(std::initializer_list<HeadTarget> inputs, const char* what) {
  for (const HeadTarget& t : inputs) {
    if (t.rows < t.in.seq || (t.values && t.rows % kBlockK != 0) || (t.per_channel && !t.values)) {
      throw std::invalid_argument(std::string(what) + ": rows below the sequence, V's keys not whole tiles, or "
                                  "per-channel scales for rows");
    }
  }
  return launch_targets<3>(inputs, [](const HeadTarget& t) {
    return static_cast<std::int64_t>(t.in.batch) * t.in.heads;
  }, what);
}

// How quantize_fp8_heads_kernel splits a head of `rows` rows in a cluster: a tile a CTA where the
// head's tiles fit a cluster of max_head_cluster(), else the largest cluster, its CTAs' rows whole
// 16-key groups. Flux's 4608 rows are 16 CTAs of 288 (72 kB, three an SM) rather than 12 of three
// tiles (96 kB, two an SM): fa3-fp8's preparation 6 % faster (H100,
// bench/results/experiments.md: 2026-11-25-h100-finer-heads). No cluster plan when a CTA would need more than
// kHeadTileBytes: two CTAs an SM, so that one's loads overlap the other's writes. At one an SM
// (CogVideoX's 144 kB), the kernel took 345 us where the two passes take 327 (ncu, H100); at two
// (Flux) 65 against 76. Such heads go to a group (fp8_group_plan).
constexpr std::size_t kHeadTileBytes = 96 * 1024;
struct HeadPlan {
  int rows_per_cta = 0;
  int staged_per_cta = 0;         // of them in the tile; the rest held in registers
  unsigned ctas_per_head = 0;     // 0: no plan
  bool in_cluster = false;        // the head's CTAs are a cluster, else a group (quantize_fp8_heads_kernel)
  std::size_t shared_bytes = 0;   // dynamic, for the tiles
};
// Where a cluster CTA's tile leaves room for fewer than four CTAs an SM, its rows beyond what four
// can stage are held in registers, if kMostHeldVectors 16-byte vectors a thread hold them: Flux's
// 288 rows are 208 staged (52 kB) and 80 held, 4x32x4096x128's 256 are 208 and 48; four CTAs an SM
// (64 registers, against 40). Side by side, sage2-int8-fp8's preparation took 3.0-4.6 % less at
// Flux (its V's 24 clusters then fit the GPU at once) and 1.4 % less at 4x32x4096x128, fa3-fp8's
// 0.9 % and 1.4 %, the codes the same (H100, bench/results/experiments.md: 2026-11-26-h100-fp8-held-rows-four-an-sm).
// Where four or more fit already (up to 4x32x1024x128, most heads at head dim 64), the registers
// would cost CTAs: fa3-fp8's preparation took 9 % longer at 4x32x1024x128 with them
// (bench/results/experiments.md: 2026-11-26-h100-fp8-held-rows).
constexpr int kMostHeldVectors = 5;

// The most rows (a multiple of 16) a CTA of `kKernel` can stage in its tile with four CTAs an SM.
template <auto kKernel, typename Elem, int kDim>
int most_staged_rows_at_four() {
  static const int most = [] {
    ATTNREPLAY_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(kHeadTileBytes)));
    int most = 0;
    for (int rows = 16; rows * kDim * sizeof(Elem) <= kHeadTileBytes; rows += 16) {
      int per_sm = 0;
      ATTNREPLAY_CUDA_CHECK(
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, kQuantThreads, rows * kDim * sizeof(Elem)));
      if (per_sm < 4) break;
      most = rows;
    }
    return most;
  }();
  return most;
}

template <typename Elem, int kDim>
HeadPlan fp8_cluster_plan(std::int64_t rows) {
  const std::int64_t tiles = std::max<std::int64_t>(1, ceil_div(rows, static_cast<std::int64_t>(kBlockK)));
  const auto largest = max_head_cluster<quantize_fp8_heads_kernel<Elem, kDim, true>, kHeadTileBytes>();
  const std::int64_t unit = tiles > largest ? 16 : kBlockK;
  const std::int64_t units = ceil_div(tiles * kBlockK, unit);
  const std::int64_t per_cta = ceil_div(units, static_cast<std::int64_t>(largest)) * unit;
  const std::size_t bytes = static_cast<std::size_t>(per_cta) * kDim * sizeof(Elem);
  if (bytes > kHeadTileBytes) return {};
  int staged = static_cast<int>(per_cta);
  if (per_cta > most_staged_rows_at_four<quantize_fp8_heads_kernel<Elem, kDim, true>, Elem, kDim>()) {
    constexpr auto kHolding = quantize_fp8_heads_kernel<Elem, kDim, true, kMostHeldVectors>;
    const int at_four = most_staged_rows_at_four<kHolding, Elem, kDim>();
    // The held rows go through the tile after the staged ones: at most as many.
    const std::int64_t held = per_cta - at_four;
    if (held <= std::min<std::int64_t>(at_four, kMostHeldVectors * kQuantThreads / (kDim / 8))) staged = at_four;
  }
  return {static_cast<int>(per_cta), staged, static_cast<unsigned>(ceil_div(tiles * kBlockK, per_cta)), true,
          static_cast<std::size_t>(staged) * kDim * sizeof(Elem)};
}

// Heads longer than a cluster holds: a group of CTAs of at most kGroupTileBytes of rows each,
// meeting in the global memory, where the group fits in half the CTAs the GPU holds at once. 72 kB
// is three CTAs an SM: fa3-fp8's preparation at 4x32x16384x128 took 1.04 ms against 1.11 at 96 kB
// (two an SM), 1.10 at 54 kB and 1.14 at 35 kB (H100, bench/results/experiments.md: 2026-11-26-h100-head-groups).
constexpr std::size_t kGroupTileBytes = 72 * 1024;

// CTAs of `kKernel` (kQuantThreads threads, `kDynamicBytes` of dynamic shared memory) that the GPU
// holds at once: how large a head's group may be (half that). Each kernel is allowed its dynamic
// shared memory as it is first asked.
template <auto kKernel, std::size_t kDynamicBytes>
std::int64_t resident_ctas() {
  static const std::int64_t resident = [] {
    if constexpr (kDynamicBytes > 0) {
      ATTNREPLAY_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(kDynamicBytes)));
    }
    int device = 0, sms = 0, per_sm = 0;
    ATTNREPLAY_CUDA_CHECK(cudaGetDevice(&device));
    ATTNREPLAY_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    ATTNREPLAY_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, kQuantThreads, kDynamicBytes));
    return static_cast<std::int64_t>(sms) * per_sm;
  }();
  return resident;
}
template <typename Elem, int kDim>
HeadPlan fp8_group_plan(std::int64_t rows) {
  const std::int64_t most_rows = static_cast<std::int64_t>(kGroupTileBytes / (kDim * sizeof(Elem))) / 16 * 16;
  const std::int64_t ctas = ceil_div(rows, most_rows);
  const std::int64_t per_cta = ceil_div(ceil_div(rows, ctas), std::int64_t{16}) * 16;
  const std::int64_t ctas_per_head = ceil_div(rows, per_cta);
  const std::size_t bytes = static_cast<std::size_t>(per_cta) * kDim * sizeof(Elem);
  // With the largest tiles: fewer tiles hold more.
  if (2 * ctas_per_head > resident_ctas<quantize_fp8_heads_kernel<Elem, kDim, false>, kGroupTileBytes>()) return {};
  return {static_cast<int>(per_cta), static_cast<int>(per_cta), static_cast<unsigned>(ctas_per_head), false, bytes};
}

template <typename Elem, int kDim>
HeadPlan fp8_head_plan(std::int64_t rows) {
  const HeadPlan cluster = fp8_cluster_plan<Elem, kDim>(rows);
  return cluster.ctas_per_head > 0 ? cluster : fp8_group_plan<Elem, kDim>(rows);
}

template <typename Elem, int kDim>
bool launch_fp8_heads(const LaunchTargets<HeadTarget, 3>& targets, std::int64_t rows, void* work, Order order,
                      cudaStream_t stream) {
  const HeadPlan plan = fp8_head_plan<Elem, kDim>(rows);
  if (plan.ctas_per_head == 0) return false;
  const std::int64_t heads = targets.first[targets.count];
  if (heads * plan.ctas_per_head > INT_MAX) {
    throw std::invalid_argument("quantize_fp8_heads: " + std::to_string(heads) + " heads of " + std::to_string(rows) +
                                " rows are more CTAs than a grid holds");
  }
  const dim3 grid(static_cast<unsigned>(heads * plan.ctas_per_head));
  if (plan.in_cluster) {
    auto* kernel = quantize_fp8_heads_kernel<Elem, kDim, true>;
    if (plan.staged_per_cta < plan.rows_per_cta) {
      constexpr auto kHolding = quantize_fp8_heads_kernel<Elem, kDim, true, kMostHeldVectors>;
      (void)max_head_cluster<kHolding, kHeadTileBytes>();  // its cluster size allowed
      kernel = kHolding;
    }
    launch_kernel_in_clusters("quantize_fp8_heads_kernel", kernel, grid, plan.ctas_per_head, kQuantThreads,
                              plan.shared_bytes, order, stream, targets, plan.rows_per_cta, plan.staged_per_cta,
                              HeadGroups{});
    return true;
  }
  if (work == nullptr) throw std::invalid_argument("quantize_fp8_heads: heads longer than a cluster need its work");
  const HeadGroups groups{static_cast<unsigned*>(work), group_counters(work, heads, kDim, plan.ctas_per_head)};
  launch_kernel("quantize_fp8_heads_kernel", quantize_fp8_heads_kernel<Elem, kDim, false>, grid, kQuantThreads,
                plan.shared_bytes, order, stream, targets, plan.rows_per_cta, plan.staged_per_cta, groups);
  return true;
}

// K's heads of `rows` keys as one cluster of a CTA a block, where the cluster may be that large;
// 0 where it may not. A CTA holds one block only: with three (Flux's 36 blocks in 12 CTAs of 96 kB,
// two an SM), its coding waited on the loads of its whole head, and the two passes over K were
// faster (H100, sage1-int8's preparation: 61 against 57 us).
template <typename Elem, int kDim>
unsigned int8_key_cluster(std::int64_t rows) {
  const std::int64_t blocks = rows / kBlockK;
  const auto largest = max_head_cluster<quantize_int8_key_heads_kernel<Elem, kDim, true>, 0>();
  return rows % kBlockK == 0 && blocks >= 1 && blocks <= largest ? static_cast<unsigned>(blocks) : 0;
}
// Longer heads at head dim 128: a group of a CTA a block, where it takes at most half the CTAs the
// GPU holds. Against the two passes, sage1-int8's preparation took 10 % less at 4x32x4096x128, 5 %
// at Flux and 2 % at 4x32x16384x128 (sage2-int8-fp8's 8 %, +1.6 % and 1 %; its whole call 0.9 %
// and 0.3 % faster at 4k and Flux, level at 16k). At head dim 64 a block is 16 kB, and the
// meeting cost more than the read it saved: 10-31 % slower at 2x24x4250x64 and CogVideoX (H100,
// bench/results/experiments.md: 2026-11-26-h100-head-groups); with Q's or V's CTAs between K's and six or eight
// CTAs an SM, still 5-33 % slower (bench/results/experiments.md: 2026-11-26-h100-key-group-registers).
// Groups pay only where the GPU is full and a head's CTAs gather soon: heads of at most 128 blocks
// (16384 keys) whose CTAs fill the GPU at least once. Side by side, groups were 5-16 % faster there
// (1x24x4608 to 1x32x8192 and 1x16x16384), and the two passes 5-7 % faster below one wave
// (1x8x8192, 512 CTAs of 792), 7-14 % (sage1) at 256 blocks, and level for sage2 there; at 384
// blocks groups took 2.4-2.5x their bound, where the two passes took 1.4-1.7x at 512
// (H100, bench/results/experiments.md: 2026-11-26-h100-key-group-reach).
constexpr std::int64_t kMaxKeyGroupBlocks = 128;
template <typename Elem, int kDim>
unsigned int8_key_group(std::int64_t rows, std::int64_t heads) {
  if constexpr (kDim != 128) {
    return 0;
  } else {
    const std::int64_t resident = resident_ctas<quantize_int8_key_heads_kernel<Elem, kDim, false>, 0>();
    const std::int64_t blocks = rows / kBlockK;
    const bool fits = rows % kBlockK == 0 && blocks >= 1 && 2 * blocks <= resident;
    const bool pays = blocks <= kMaxKeyGroupBlocks && heads * blocks >= resident;
    return fits && pays ? static_cast<unsigned>(blocks) : 0;
  }
}
template <typename Elem, int kDim>
bool launch_int8_key_heads(const Int8Target& keys, QuantGranularity granularity, void* work, Order order,
                           cudaStream_t stream, const Int8Target* queries, const HeadTarget* values,
                           void* values_work, bool& others_done) {
  const Int8Job job{granularity, 1.0f, nullptr, keys.out, int8_groups_per_block(true, granularity)};
  const std::int64_t heads = static_cast<std::int64_t>(keys.in.batch) * keys.in.heads;
  if (const unsigned cluster = int8_key_cluster<Elem, kDim>(keys.out.rows); cluster > 0) {
    launch_kernel_in_clusters("quantize_int8_key_heads_kernel", quantize_int8_key_heads_kernel<Elem, kDim, true>,
                              dim3(static_cast<unsigned>(heads * cluster)), cluster, kQuantThreads, 0, order, stream,
                              keys.in, job, KeyGroups{}, QueryBlocks{}, ValueHeads{});
    return true;
  }
  const unsigned blocks = int8_key_group<Elem, kDim>(keys.out.rows, heads);
  if (blocks == 0) return false;
  if (work == nullptr) {
    throw std::invalid_argument("quantize_int8_key_heads: heads longer than a cluster need its work");
  }
  QueryBlocks with_queries;
  if (queries != nullptr) {
    if (queries->in.head_dim != keys.in.head_dim || queries->in.element != keys.in.element) {
      throw std::invalid_argument("quantize_int8_key_heads: Q's head dim and element type differ from K's");
    }
    with_queries = {*queries, queries->out.rows / kBlockQ * queries->in.batch * queries->in.heads};
  }
  ValueHeads with_values;
  if (values != nullptr) {
    if (queries != nullptr || values_work == nullptr || values->rows != keys.out.rows ||
        values->in.head_dim != keys.in.head_dim || values->in.element != keys.in.element) {
      throw std::invalid_argument("quantize_int8_key_heads: V's heads need their work, K's rows, head dim and "
                                  "element type, and no Q beside them");
    }
    with_values.targets = fp8_head_targets({*values}, "quantize_int8_key_heads");
    const std::int64_t value_heads = with_values.targets.first[1];
    with_values.groups = {static_cast<unsigned*>(values_work), group_counters(values_work, value_heads, kDim, blocks)};
    with_values.ctas = value_heads * blocks;
  }
  const std::int64_t all = heads * blocks + with_queries.ctas + with_values.ctas;  // the launch's CTAs
  if (all > INT_MAX) {
    throw std::invalid_argument("quantize_int8_key_heads: " + std::to_string(heads) + " heads of " +
                                std::to_string(blocks) + " blocks (and Q's or V's) are more CTAs than a grid holds");
  }
  others_done = queries != nullptr || values != nullptr;
  // With Q's blocks beside them, K's places end a wave of CTAs before the launch does: the last
  // wave is then Q's, which wait for nobody, rather than K heads' last CTAs and the CTAs waiting
  // for them. Against K's places spread over the whole launch, side by side, sage1-int8's
  // preparation took 3 % less at Flux, 1.7 % at 4x32x4096x128, level at 4x32x16384x128 (H100,
  // bench/results/experiments.md: 2026-11-26-h100-key-span). V's heads wait for each other as K's do: a tail of
  // V's alone was 2.5-10 % slower at 4x32x16384x128, so V keeps the whole launch.
  const std::int64_t key_span =
      queries != nullptr
          ? std::max(heads * blocks, all - resident_ctas<quantize_int8_key_heads_kernel<Elem, kDim, false>, 0>())
          : all;
  const KeyGroups groups{static_cast<float*>(work), group_counters(work, heads, std::int64_t{blocks} * kDim, blocks),
                         key_span};
  launch_kernel("quantize_int8_key_heads_kernel", quantize_int8_key_heads_kernel<Elem, kDim, false>,
                dim3(static_cast<unsigned>(all)), kQuantThreads, 0,
                order, stream, keys.in, job, groups, with_queries, with_values);
  return true;
}

}  // namespace

void copy_to_bhsd(const InputView& in, void* out, Order order, cudaStream_t stream, int out_dim) {
  if (out_dim == 0) out_dim = in.head_dim;
  if (out_dim < in.head_dim || in.head_dim % 8 != 0 || out_dim % 8 != 0) {
    throw std::invalid_argument("copy_to_bhsd: head dim " + std::to_string(in.head_dim) + " into " +
                                std::to_string(out_dim) + " (multiples of 8, never narrower)");
  }
  const std::int64_t vectors = static_cast<std::int64_t>(in.batch) * in.heads * in.seq * (out_dim * 2 / 16);
  launch_kernel("copy_to_bhsd_kernel", copy_to_bhsd_kernel, grid_for(vectors, kQuantThreads), kQuantThreads, 0, order,
                stream, in, static_cast<uint4*>(out), out_dim);
}

std::size_t channel_means_work_bytes(const InputView& keys) {
  const auto heads = static_cast<std::size_t>(keys.batch) * static_cast<std::size_t>(keys.heads);
  const auto blocks = static_cast<std::size_t>(ceil_div(keys.seq, kBlockK));
  return heads * blocks * static_cast<std::size_t>(keys.head_dim) * sizeof(float) + heads * sizeof(unsigned);
}

void channel_means(const InputView& keys, float* mean, void* work, const MaxTarget& values, Order order,
                   cudaStream_t stream) {
  if (keys.seq == 0) {  // no keys: nothing to subtract, as the emulation has it
    ATTNREPLAY_CUDA_CHECK(cudaMemsetAsync(mean, 0, sizeof(float) * keys.batch * keys.heads * keys.head_dim, stream));
    return;
  }
  const std::int64_t blocks = ceil_div(keys.seq, kBlockK);
  ChannelMeans job{static_cast<float*>(work), nullptr, mean};
  job.finished = reinterpret_cast<unsigned*>(job.block_sums + static_cast<std::int64_t>(keys.batch) * keys.heads *
                                                                  blocks * keys.head_dim);
  if (values.amax && (values.in.batch != keys.batch || values.in.heads != keys.heads || values.in.seq != keys.seq ||
                      values.in.head_dim != keys.head_dim || values.in.element != keys.element)) {
    throw std::invalid_argument("channel_means: V's maxima need V shaped as K");
  }
  ATTNREPLAY_FOR_ELEMENT_AND_DIM(keys, launch_kernel("channel_mean_kernel", channel_mean_kernel<Elem, kDim>,
                                                     head_grid(blocks, keys), kQuantThreads, 0, order, stream, keys,
                                                     job, values));
}

void quantize_int8(std::initializer_list<Int8Target> inputs, QuantGranularity granularity, Order order,
                   cudaStream_t stream) {
  const auto blocks = [](const Int8Target& t) {
    return t.out.rows / (t.is_key ? kBlockK : kBlockQ) * t.in.batch * t.in.heads;  // a CTA a block
  };
  const auto targets = launch_targets<2>(inputs, blocks, "quantize_int8");
  // At head dim 64 each input has a launch: Q's blocks in CTAs of 128 threads, twice as many of
  // them in flight, took sage1-int8's Q and K codes from 165 to 150 us at CogVideoX (ncu), while
  // K's took 5 us longer in CTAs of 128 (H100, bench/results/experiments.md: 2026-11-25-h100-int8-d64-threads).
  if (targets.target[0].in.head_dim == 64) {
    for (const Int8Target& t : inputs) {
      const auto one = launch_targets<2>({t}, blocks, "quantize_int8");
      const auto ctas = static_cast<unsigned>(one.first[1]);
      const Order this_order = std::exchange(order, Order::overlapping);
      ATTNREPLAY_FOR_ELEMENT_AND_DIM(t.in, if (t.is_key) {
        launch_kernel("quantize_int8_kernel", quantize_int8_kernel<Elem, kDim, kQuantThreads>, dim3(ctas), kQuantThreads,
                      0, this_order, stream, one, granularity);
      } else {
        launch_kernel("quantize_int8_kernel", quantize_int8_kernel<Elem, kDim, kQuantThreads / 2>, dim3(ctas),
                      kQuantThreads / 2, 0, this_order, stream, one, granularity);
      });
    }
    return;
  }
  const auto ctas = static_cast<unsigned>(targets.first[targets.count]);
  ATTNREPLAY_FOR_ELEMENT_AND_DIM(targets.target[0].in,
                                 launch_kernel("quantize_int8_kernel", quantize_int8_kernel<Elem, kDim, kQuantThreads>,
                                               dim3(ctas), kQuantThreads, 0, order, stream, targets, granularity));
}

void abs_max(std::initializer_list<MaxTarget> inputs, bool per_channel, bool per_tensor, Order order,
             cudaStream_t stream) {
  const auto targets = launch_targets<3>(inputs, [](const MaxTarget& t) {
    return ceil_div(t.in.seq, static_cast<std::int64_t>(kMaxKeys)) * t.in.batch * t.in.heads;  // a CTA kMaxKeys keys
  }, "abs_max");
  const auto ctas = static_cast<unsigned>(targets.first[targets.count]);
  ATTNREPLAY_FOR_ELEMENT_AND_DIM(targets.target[0].in,
                                 launch_kernel("abs_max_kernel", abs_max_kernel<Elem, kDim>, dim3(ctas), kQuantThreads,
                                               0, order, stream, targets, per_channel, per_tensor));
}

void quantize_fp8_rows(std::initializer_list<RowsTarget> inputs, Order order, cudaStream_t stream) {
  const auto targets = launch_targets<2>(inputs, [](const RowsTarget& t) {
    return static_cast<std::int64_t>(t.in.batch) * t.in.heads * t.rows * (t.in.head_dim / 16);  // 16 codes an item
  }, "quantize_fp8_rows");
  const std::int64_t vectors = targets.first[targets.count];
  const bool bf16 = targets.target[0].in.element == Element::bf16;
  launch_kernel("quantize_fp8_rows_kernel", bf16 ? quantize_fp8_rows_kernel<__nv_bfloat16> : quantize_fp8_rows_kernel<__half>,
                grid_for(vectors, kQuantThreads), kQuantThreads, 0, order, stream, targets);
}

void quantize_fp8_values(const InputView& in, const Fp8Scales& scales, std::uint8_t* out, std::int64_t keys,
                         Order order, cudaStream_t stream) {
  ATTNREPLAY_FOR_ELEMENT_AND_DIM(in, launch_kernel("quantize_fp8_values_kernel", quantize_fp8_values_kernel<Elem, kDim>,
                                                   head_grid(keys / kBlockK, in), kQuantThreads, 0, order, stream, in,
                                                   scales, out, keys));
}

bool fp8_heads_fit(std::int64_t rows, const InputView& in) {
  bool fit = false;
  ATTNREPLAY_FOR_ELEMENT_AND_DIM(in, fit = (fp8_head_plan<Elem, kDim>(rows).ctas_per_head > 0));
  return fit;
}

std::size_t fp8_heads_work_bytes(std::int64_t rows, const InputView& in, std::int64_t heads) {
  bool in_cluster = true;
  ATTNREPLAY_FOR_ELEMENT_AND_DIM(in, in_cluster = (fp8_cluster_plan<Elem, kDim>(rows).ctas_per_head > 0));
  if (in_cluster) return 0;
  return group_work_bytes(heads, in.head_dim);
}

void quantize_fp8_heads(std::initializer_list<HeadTarget> inputs, void* work, Order order, cudaStream_t stream) {
  const auto targets = fp8_head_targets(inputs, "quantize_fp8_heads");
  std::int64_t rows = 0;
  for (const HeadTarget& t : inputs) rows = std::max(rows, t.rows);
  bool launched = false;
  ATTNREPLAY_FOR_ELEMENT_AND_DIM(targets.target[0].in,
                                 launched = (launch_fp8_heads<Elem, kDim>(targets, rows, work, order, stream)));
  if (!launched) {
    throw std::invalid_argument("quantize_fp8_heads: heads of " + std::to_string(rows) +
                                " rows fit no cluster or group");
  }
}

bool int8_key_heads_fit(std::int64_t rows, const InputView& keys) {
  const std::int64_t heads = static_cast<std::int64_t>(keys.batch) * keys.heads;
  bool fit = false;
  ATTNREPLAY_FOR_ELEMENT_AND_DIM(
      keys, fit = (int8_key_cluster<Elem, kDim>(rows) > 0 || int8_key_group<Elem, kDim>(rows, heads) > 0));
  return fit;
}

std::size_t int8_key_heads_work_bytes(std::int64_t rows, const InputView& keys) {
  bool in_cluster = true;
  ATTNREPLAY_FOR_ELEMENT_AND_DIM(keys, in_cluster = (int8_key_cluster<Elem, kDim>(rows) > 0));
  if (in_cluster) return 0;
  const std::int64_t heads = static_cast<std::int64_t>(keys.batch) * keys.heads;
  return group_work_bytes(heads, ceil_div(rows, kBlockK) * keys.head_dim);
}

std::size_t int8_key_heads_values_work_bytes(const InputView& values) {
  return group_work_bytes(static_cast<std::int64_t>(values.batch) * values.heads, values.head_dim);
}

bool quantize_int8_key_heads(const Int8Target& keys, QuantGranularity granularity, void* work, Order order,
                             cudaStream_t stream, const Int8Target* queries, const HeadTarget* values,
                             void* values_work) {
  if (!keys.is_key || keys.in.seq == 0 || keys.out.rows != ceil_div(keys.in.seq, kBlockK) * kBlockK) {
    throw std::invalid_argument("quantize_int8_key_heads: K with keys, its codes padded to whole blocks of keys");
  }
  bool launched = false, others_done = false;
  ATTNREPLAY_FOR_ELEMENT_AND_DIM(keys.in,
                                 launched = (launch_int8_key_heads<Elem, kDim>(keys, granularity, work, order, stream,
                                                                               queries, values, values_work,
                                                                               others_done)));
  if (!launched) {
    throw std::invalid_argument("quantize_int8_key_heads: heads of " + std::to_string(keys.out.rows) +
                                " keys fit no cluster or group");
  }
  return others_done;
}

}  // namespace attnreplay::cuda_attention
