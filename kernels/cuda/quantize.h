#pragma once
// Input preparation on the GPU (docs/quantized.md, steps 1 and 2 and the FP8 conversions): layout
// change, K's channel means, INT8 codes of Q and K with a scale per group, FP8 Q/K/V. Each function
// queues its kernel on `stream`, in `order` after the work before it there (device_utils.cuh).
// Internal to kernels/cuda.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/cuda_attention.h"
#include "kernels/cuda/device_utils.cuh"

namespace attnreplay::cuda_attention {

// One of Q, K, V as uploaded: 16-bit elements, channels contiguous, the rest by strides.
struct InputView {
  const void* data = nullptr;
  std::int64_t stride_b = 0;  // in elements
  std::int64_t stride_h = 0;
  std::int64_t stride_s = 0;
  int batch = 0;
  int heads = 0;
  std::int64_t seq = 0;
  int head_dim = 0;
  Element element = Element::bf16;
};

// A contiguous (batch, heads, seq, out_dim) copy, channels from in.head_dim on 0 (a head dim the
// kernels take by padding; out_dim 0: in.head_dim). Head dims are multiples of 8 (16-byte rows).
void copy_to_bhsd(const InputView& in, void* out, Order order, cudaStream_t stream, int out_dim = 0);

struct Int8Output {
  std::int8_t* codes = nullptr;  // (batch, heads, rows, head_dim), rows >= seq padded with 0
  std::int64_t rows = 0;         // a multiple of the block (64 for Q, 128 for K)
  float* scales = nullptr;       // (batch, heads, groups)
  std::int64_t groups = 0;       // per head: blocks * groups a block (see int8_groups_per_block)
};
// Scale groups in one 64-row (Q) or 128-key (K) block.
__host__ __device__ inline int int8_groups_per_block(bool is_key, QuantGranularity granularity) {
  if (granularity == QuantGranularity::per_thread) return is_key ? 8 : 32;
  if (granularity == QuantGranularity::per_warp && !is_key) return kBlockQ / kWarpQ;
  return 1;
}
// Q: x = Q * pre_scale; K: x = K - mean (mean null: not smoothed). Codes and per-group scales.
struct Int8Target {
  InputView in;
  bool is_key = false;
  float pre_scale = 1.0f;
  const float* mean = nullptr;
  Int8Output out;
};
// Q's and K's codes in one launch (of one element type and head dim): one launch fewer is what
// the short calls' preparation is made of. At head dim 64, a launch each, Q's in smaller CTAs.
void quantize_int8(std::initializer_list<Int8Target> inputs, QuantGranularity granularity, Order order,
                   cudaStream_t stream);
// K smoothed and coded from one read: a thread block cluster holds one (b, h) of K in shared memory,
// a 128-key block a CTA, takes the head's channel means as channel_means does, bit for bit, and
// codes its blocks with them as quantize_int8 does, where channel_means followed by quantize_int8
// reads K twice. The means stay on chip (`keys.mean` is not read). Heads of more than 16 blocks (8
// where the GPU schedules no larger cluster) are held by a group of CTAs that share their block
// sums in `work`, at head dim 128 only. For K with at least one key, its codes padded to whole
// blocks, in heads that fit a cluster or a group: int8_key_heads_fit() says.
// Where a group holds K's heads, the same launch can also code, in CTAs between K's, one of:
// - `queries`, sage1's Q (of K's head dim and element type), as quantize_int8 does;
// - `values`, sage2's V (K's rows), as quantize_fp8_heads does, a 128-key block a CTA, its groups
//   meeting in `values_work` (int8_key_heads_values_work_bytes(), zeroed once).
// Returns whether it did; where it did not, the caller codes them.
bool int8_key_heads_fit(std::int64_t rows, const InputView& keys);
// The bytes of `work` for K's heads of `rows` keys: 0 where they fit a cluster. Zeroed once before
// the first launch; each launch leaves its counters zeroed.
std::size_t int8_key_heads_work_bytes(std::int64_t rows, const InputView& keys);
struct HeadTarget;
bool quantize_int8_key_heads(const Int8Target& keys, QuantGranularity granularity, void* work, Order order,
                             cudaStream_t stream, const Int8Target* queries = nullptr,
                             const HeadTarget* values = nullptr, void* values_work = nullptr);
std::size_t int8_key_heads_values_work_bytes(const InputView& values);

// max |x| as float bits (non-negative floats order as unsigned ints) into `amax`, which the caller
// zeroes: one per (b, h, channel) when per_channel, one per (b, h), or one for all when per_tensor.
struct MaxTarget {
  InputView in;
  unsigned* amax = nullptr;
};
// Up to three inputs of one element type and head dim in one launch.
void abs_max(std::initializer_list<MaxTarget> inputs, bool per_channel, bool per_tensor, Order order,
             cudaStream_t stream);

// mean[(b, h), c] = (sum over 128-key blocks, in block order, of each block's keys summed in key
// order; fp32) / seq: (batch * heads, head_dim) floats, as the emulation defines it. `work` holds
// the block sums and a counter per head: channel_means_work_bytes(keys) bytes, zeroed once before
// the first call (each call leaves its counters at zero). With `values.amax`, V's per-channel
// maxima come out of the same launch as abs_max(per_channel) puts them (into zeroed `amax`).
struct ChannelMeans {
  float* block_sums = nullptr;
  unsigned* finished = nullptr;  // CTAs done per head
  float* mean = nullptr;
};
std::size_t channel_means_work_bytes(const InputView& keys);
void channel_means(const InputView& keys, float* mean, void* work, const MaxTarget& values, Order order,
                   cudaStream_t stream);

// FP8 scales from those maxima: scale = amax / target (448, or 2.25 for sage2's V under
// fp32+fp16), and the codes are e4m3(x * (target / amax)). The quantization kernels compute both
// where they use them and write the scales to `scales` for the attention kernel.
struct Fp8Scales {
  const unsigned* amax = nullptr;
  bool per_channel = false;
  bool per_tensor = false;
  float target = 448.0f;
  float* scales = nullptr;  // one per (b, h), or per (b, h, channel) when per_channel
};

// e4m3 codes, one scale per (b, h); (batch, heads, rows, head_dim) with rows >= seq zero. Up to two
// inputs (Q and K) in one launch.
struct RowsTarget {
  InputView in;
  Fp8Scales scales;
  std::uint8_t* out = nullptr;
  std::int64_t rows = 0;
};
void quantize_fp8_rows(std::initializer_list<RowsTarget> inputs, Order order, cudaStream_t stream);
// V for the e4m3 P·V: codes with a scale per (b, h, channel) or per (b, h), transposed to
// (batch, heads, head_dim, keys) with keys >= seq zero and each 32 keys permuted to the order
// in which the attention kernel's P fragment holds them.
void quantize_fp8_values(const InputView& in, const Fp8Scales& scales, std::uint8_t* out, std::int64_t keys,
                         Order order, cudaStream_t stream);

// FP8 codes of whole heads from one read of the input: a cluster of CTAs holds one (b, h) of one
// input in shared memory, so that the head's maxima are known before any code is written, where
// abs_max followed by quantize_fp8_rows / quantize_fp8_values reads the input twice. A head longer
// than a cluster holds is held by a group of CTAs that share their maxima in `work`. Codes and
// scales are the two passes', byte for byte. Only for heads that fit a cluster or a group:
// fp8_heads_fit() says.
struct HeadTarget {
  InputView in;
  bool values = false;       // V: transposed and permuted as quantize_fp8_values writes it; else rows
  bool per_channel = false;  // a scale per (b, h, channel) (values only); else per (b, h)
  float target = 448.0f;     // as Fp8Scales::target
  float* scales = nullptr;
  std::uint8_t* out = nullptr;
  std::int64_t rows = 0;  // rows (or keys) of `out` a head, >= in.seq, zeros past it
};
// Whether heads of `rows` rows (the most of a launch's inputs) of `in`'s element type and head dim do.
bool fp8_heads_fit(std::int64_t rows, const InputView& in);
// The bytes of `work` for a launch of `heads` heads (all its inputs') of `rows` rows: 0 where they
// fit a cluster. Zeroed once before the first launch; each launch leaves it zeroed.
std::size_t fp8_heads_work_bytes(std::int64_t rows, const InputView& in, std::int64_t heads);
// Up to three inputs of one element type and head dim in one launch.
void quantize_fp8_heads(std::initializer_list<HeadTarget> inputs, void* work, Order order, cudaStream_t stream);

}  // namespace attnreplay::cuda_attention
