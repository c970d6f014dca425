#pragma once
// What the attention kernels read, as prepared by kernels/cuda/quantize.cu, and one entry point per
// kind (kernels/cuda/{flash,sage1_int8,sage2_int8_fp8,fa3_fp8}.cu) for its launches, each queued in
// `order` after the work before it on `stream`. Internal to kernels/cuda.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/cuda_attention.h"
#include "kernels/cuda/device_utils.cuh"

namespace attnreplay::cuda_attention {

// The definition's blocks (docs/quantized.md): query rows in blocks of 64, each 4 warp tiles of 16;
// keys in blocks of 128. The attention kernel gives each query block a warpgroup.
inline constexpr int kBlockQ = 64;
inline constexpr int kWarpQ = 16;
inline constexpr int kBlockK = 128;

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Per kind, the buffers (all (batch, heads, ...) with heads the kind's own: heads_q for Q and the
// output, heads_kv for K and V):
//   flash: q, k, v rows of head_dim input elements (bhsd).
//   sage1: q, k INT8 codes, rows padded to 64 / 128 with zeros; q_scale, k_scale per group;
//          v as flash.
//   sage2: q as uploaded (16-bit, the call's layout: q_stride_*), quantized to sage1's codes by
//          the attention kernel itself; k as sage1; v e4m3, transposed to (head_dim, v_length
//          keys) with the keys of each 32 permuted as the m16n8k32 A fragment of P holds them;
//          v_scale per channel (s_v / 448, applied to the output).
//   fa3:   q, k e4m3 rows, padded as sage1; v as sage2; q_scale, k_scale, v_scale one per head.
struct AttentionArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;  // (batch, heads_q, seq_q, out_dim), input element type
  const float* q_scale = nullptr;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  std::int64_t seq_q = 0;
  std::int64_t seq_kv = 0;
  std::int64_t q_rows = 0;    // rows stored per head of q (seq_q, or padded)
  std::int64_t k_rows = 0;    // rows stored per head of k
  std::int64_t v_length = 0;  // rows stored per head of v (16-bit), or keys per channel (e4m3)
  std::int64_t q_groups = 0;  // sage1: scales per head of q (sage2 codes Q in its kernel)
  std::int64_t k_groups = 0;  // Sage: scales per head of k
  // sage2: the strides of Q's rows, heads and batch entries, in elements.
  std::int64_t q_stride_s = 0;
  std::int64_t q_stride_h = 0;
  std::int64_t q_stride_b = 0;
  int heads_q = 0;
  int heads_kv = 0;
  int batch = 0;
  int head_dim = 0;  // of the buffers above: 64 or 128
  int out_dim = 0;   // the output's: head_dim, or less (a multiple of 8) where V's channels were padded
  Element element = Element::bf16;
  QuantGranularity granularity = QuantGranularity::per_warp;
  PvAccum pv_accumulation = PvAccum::fp32_fp32;
  float score_scale = 0;  // softmax scale * log2e, in fp32 as the emulation computes it
  bool causal = false;
  std::int64_t causal_offset = 0;  // key j visible to row i when j <= i + causal_offset
  // A split of the keys (batch 1, no causality; Attention::run): this part's keys are the seq_kv
  // from key_begin on (a multiple of kBlockK) of buffers whose rows per head are still k_rows and
  // v_length, and k_scale starts at its first block. It writes its rows normalized by its own l in
  // fp32, (heads_q, seq_q, out_dim) at split_out, and each row's m + log2 l (-inf where it sees no
  // key) at split_lse, for combine_key_splits; `out` is left alone.
  std::int64_t key_begin = 0;
  float* split_out = nullptr;
  float* split_lse = nullptr;
};

// What the kernel reads: the buffers, and a TMA descriptor for each of Q, K and V (as bytes, in
// the layout attention_kernel.cuh gives). A launch over several calls (`parts`) reads each call's
// own from global memory, call c's by the CTAs of grid z = c.
struct AttentionParams {
  AttentionArgs args;
  CUtensorMap q_map;
  CUtensorMap k_map;
  CUtensorMap v_map;
  const AttentionParams* parts = nullptr;
};

// What to do with a kind's attention kernel, at the tile the calls' head dim, element type and
// options pick: launch it for one call; make several calls' parameters (each of batch 1: a padded
// batch's entries, a ragged batch's sequences; kind, head dims, heads and options alike); or launch
// it once over those, uploaded.
struct KernelJob {
  enum class What { launch, make_parts, launch_parts };
  What what = What::launch;
  const AttentionArgs* args = nullptr;  // the call; for parts, the first
  Order order = Order::after_all;
  cudaStream_t stream = nullptr;
  const std::vector<AttentionArgs>* parts = nullptr;  // make_parts: the calls
  std::vector<AttentionParams>* made = nullptr;        // make_parts: their parameters, in order
  const AttentionParams* device_parts = nullptr;      // launch_parts: those, in device memory
  int part_count = 0;
  std::int64_t longest_seq_q = 0;                     // launch_parts: the grid's query blocks
};

// The output of `splits` key splits of one call (batch 1): row r's is the sum of the splits' rows
// weighted by exp2(lse - the largest lse), over the weights' sum; 0 where no split saw a key.
// parts: (splits, rows, out_dim) fp32; lse: (splits, rows); out: (rows, out_dim) in `element`.
void combine_key_splits(const float* parts, const float* lse, int splits, std::int64_t rows, int out_dim,
                        Element element, void* out, cudaStream_t stream);

void flash_attention(const KernelJob& job);
void sage1_int8_attention(const KernelJob& job);
void sage2_int8_fp8_attention(const KernelJob& job);
void fa3_fp8_attention(const KernelJob& job);
// The one of the four for `kind`.
void kind_attention(QuantizedKind kind, const KernelJob& job);

}  // namespace attnreplay::cuda_attention
