#pragma once
// The attention kernel of all four kinds (docs/quantized.md), for Hopper's warpgroup MMA (sm_90a).
// A CTA of 2 warpgroups takes 128 query rows of one (batch, head); each warpgroup computes one
// 64-row block of the definition, each of its 4 warps 16 rows of it. Keys come in blocks of 128
// through shared memory, which both warpgroups read and load: cp.async into three stages (block
// kb + 1 loads while kb is computed), each stage's arrival marked on an mbarrier, in key order,
// with an online softmax in fp32 and exp2. The warpgroups take turns to issue their MMAs
// (FlashAttention-3's ping-pong), so that one's softmax runs while the other's MMAs do; nothing
// else holds one back for the other.
//
// Per warpgroup and key block: S (64 x 128) = Q·Kᵀ by wgmma with Q and K in shared memory, then
// scaled, masked and soft-maxed in registers, and P handed to P·V's wgmma as its register operand:
//   flash  Q·Kᵀ k16 bf16/fp16 -> f32; P·V k16 bf16/fp16 -> f32
//   sage1  Q·Kᵀ k32 s8 -> s32;        P·V as flash
//   sage2  Q·Kᵀ as sage1;             P·V k32 e4m3 -> f32 (-> f16 per 32 keys for fp32+fp16)
//   fa3    Q·Kᵀ k32 e4m3 -> f32;      P·V k32 e4m3 -> f32
// A warpgroup MMA's accumulator gives each warp its 16 rows laid out as mma.sync's m16n8 C
// fragment: a thread holds rows g and g + 8 and, in each 8-key tile, keys 2t and 2t + 1
// (g = lane / 4, t = lane % 4), the INT8 per_thread groups of the definition; and its register A
// operand is laid out as mma.sync's A fragment, so P goes from one to the other in registers.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace attnreplay::cuda_attention {

template <Kind kKindT, int kDimT, typename ElementT, PvAccumulation kPvT>
struct AttentionTile {
  using Elem = ElementT;
  // A warpgroup per 64-row query block, two taking turns on the tensor cores.
  static constexpr int kWarpGroups = 2;
  static constexpr int kThreads = 128 * kWarpGroups;
  static constexpr int kCtaQ = kBlockQ * kWarpGroups;
  static constexpr Kind kKind = kKindT;
  static constexpr int kDim = kDimT;
  static constexpr PvAccumulation kPv = kPvT;
  static constexpr bool kInt8Scores = kKind == Kind::sage1_int8 || kKind == Kind::sage2_int8_fp8;
  static constexpr bool kFp8Scores = kKind == Kind::fa3_fp8;
  static constexpr bool kFp8Values = kKind == Kind::sage2_int8_fp8 || kKind == Kind::fa3_fp8;
  static constexpr int kQkRowBytes = kDim * (kInt8Scores || kFp8Scores ? 1 : 2);
  // One MMA k-step is 32 bytes of a row: k16 of 16-bit elements, k32 of 8-bit ones.
  static constexpr int kQkSteps = kQkRowBytes / 32;
  // 16-bit V as (key, channel) rows, read N-major; e4m3 V as (channel, key) rows, read K-major.
  static constexpr int kVRows = kFp8Values ? kDim : kBlockK;
  static constexpr int kVRowBytes = kFp8Values ? kBlockK : kDim * 2;
  static constexpr int kPvSteps = kFp8Values ? kBlockK / 32 : kBlockK / 16;
  static constexpr int kSmemQ = kCtaQ * kQkRowBytes;
  static constexpr int kSmemK = kBlockK * kQkRowBytes;
  static constexpr int kSmemV = kVRows * kVRowBytes;
  // Three stages of K and V: the stage a warpgroup loads into was last read two blocks back, which
  // the turns prove the other warpgroup done with. 1024 spare bytes to align the first tile.
  static constexpr int kStages = 3;
  static constexpr int kSmemBytes = kSmemQ + kStages * (kSmemK + kSmemV) + 1024;
  static constexpr int kScoreTiles = kBlockK / 8;
  static constexpr int kOutTiles = kDim / 8;
  static_assert(kDim == 64 || kDim == 128, "head dims 64 and 128");
  static_assert(kSmemQ % 1024 == 0 && kSmemK % 1024 == 0 && kSmemV % 1024 == 0, "tiles on 1024-byte boundaries");
};

// Shared-memory tiles are laid out as the MMA descriptors read them: rows of 128 bytes (wider rows
// split into 128-byte column blocks, one after the other, each kRows rows) or of 64 bytes, the
// 16-byte chunks of each 8 rows permuted by the 128-byte (64-byte) swizzle, which spreads a
// column of chunks over all banks. The tile starts on a 1024-byte boundary: the hardware swizzles
// by address bits.
template <int kRowBytes>
inline constexpr int kSwizzleBytes = kRowBytes >= 128 ? 128 : 64;

template <int kRows, int kRowBytes>
__device__ __forceinline__ int swizzled_offset(int row, int chunk) {
  static_assert(kRowBytes % 128 == 0 || kRowBytes == 64, "rows of 64 bytes or whole 128-byte blocks");
  if constexpr (kRowBytes >= 128) {
    const int offset = (chunk / 8) * kRows * 128 + row * 128 + (chunk % 8) * 16;
    return offset ^ ((offset >> 3) & 0x70);  // chunk bits 4-6 ^= row bits 7-9
  } else {
    const int offset = row * 64 + chunk * 16;
    return offset ^ ((offset >> 3) & 0x30);  // chunk bits 4-5 ^= bits 7-8
  }
}

// kRows rows of kRowBytes from `global` (row r at global + r * global_pitch) into a swizzled
// tile; rows from valid_rows on are zero-filled (never garbage: a NaN there would survive
// multiplication by a zero probability).
template <int kRows, int kRowBytes, int kThreads>
__device__ __forceinline__ void load_tile_async(std::uint8_t* tile, const std::uint8_t* global,
                                                std::int64_t global_pitch, int valid_rows) {
  constexpr int kChunksPerRow = kRowBytes / 16;
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static_assert(kThreads % kChunksPerRow == 0 && kRows % kRowsPerPass == 0, "whole passes of the CTA");
  // A thread copies the same chunk of rows `row`, row + kRowsPerPass, ...: a multiple of 8 apart,
  // so the swizzle moves the chunk alike in each, and shared and global addresses step by constants.
  static_assert(kRowsPerPass % 8 == 0, "equal swizzle in every pass");
  const int row = static_cast<int>(threadIdx.x) / kChunksPerRow;
  const int chunk = static_cast<int>(threadIdx.x) % kChunksPerRow;
  std::uint8_t* destination = tile + swizzled_offset<kRows, kRowBytes>(row, chunk);
  const std::uint8_t* source = global + row * global_pitch + chunk * 16;
  constexpr int kAtomRow = kRowBytes >= 128 ? 128 : 64;
#pragma unroll
  for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
    const bool valid = row + pass * kRowsPerPass < valid_rows;
    cp_async_16(destination + pass * kRowsPerPass * kAtomRow, valid ? source : global, valid);
    source += kRowsPerPass * global_pitch;
  }
}

// The operand of one 32-byte k-step of a K-major tile (Q, K, and e4m3 V): rows first_row.. of it.
// Consecutive 8-row groups are 8 rows' bytes apart; the k-step moves the start within the row.
template <int kRows, int kRowBytes>
__device__ __forceinline__ std::uint64_t k_major_operand(const std::uint8_t* tile, int first_row, int step) {
  constexpr int kAtomRow = kRowBytes >= 128 ? 128 : 64;
  const int byte = step * 32;
  const int offset = (byte / kAtomRow) * kRows * kAtomRow + first_row * kAtomRow + byte % kAtomRow;
  return matrix_descriptor(shared_address(tile) + offset, 16, 8 * kAtomRow, kSwizzleBytes<kRowBytes>);
}

// The B operand of one k16 step of 16-bit V, (key, channel) rows read N-major: 16 keys are two
// 8-key groups 1024 bytes apart; 64-channel column blocks follow each other at a block's size.
__device__ __forceinline__ std::uint64_t n_major_values_operand(const std::uint8_t* tile, int step) {
  return matrix_descriptor(shared_address(tile) + step * 16 * 128, kBlockK * 128, 1024, 128);
}

// fence_registers for P's register operands, one row of 4 per k-step.
template <int kSteps>
__device__ __forceinline__ void fence_operand_rows(std::uint32_t (&pa)[kSteps][4]) {
#pragma unroll
  for (int c = 0; c < kSteps; ++c) fence_registers(pa[c]);
}

template <class Tile>
__global__ void __launch_bounds__(Tile::kThreads, 1) attention_kernel(const AttentionArgs a) {
  using Elem = typename Tile::Elem;
  constexpr int kDim = Tile::kDim;
  constexpr float kInf = INFINITY;
  constexpr int kCtaQ = Tile::kCtaQ;
  constexpr int kThreads = Tile::kThreads;
  extern __shared__ std::uint8_t shared_bytes[];
  std::uint8_t* const sq = shared_bytes + ((1024 - (shared_address(shared_bytes) & 1023)) & 1023);
  std::uint8_t* const sk0 = sq + Tile::kSmemQ;
  std::uint8_t* const sv0 = sk0 + Tile::kStages * Tile::kSmemK;
  __shared__ std::uint64_t stage_loaded[Tile::kStages];  // each thread arrives when its copies land

  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  const int warp = static_cast<int>(threadIdx.x) % 128 / 32;  // in the warpgroup
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4;   // fragment row (and row + 8)
  const int t4 = lane % 4;  // fragment column pair
  // Causal query blocks late in the sequence see the most keys: start them first, so that the
  // last wave is short.
  const std::int64_t cta_block = static_cast<std::int64_t>(gridDim.x) - 1 - blockIdx.x;
  const int h = static_cast<int>(blockIdx.y);
  const int b = static_cast<int>(blockIdx.z);
  const int h_kv = h / (a.heads_q / a.heads_kv);
  const std::int64_t head_q = static_cast<std::int64_t>(b) * a.heads_q + h;
  const std::int64_t head_kv = static_cast<std::int64_t>(b) * a.heads_kv + h_kv;
  const std::int64_t cta_q0 = cta_block * kCtaQ;
  const std::int64_t q_block = cta_block * Tile::kWarpGroups + warpgroup;  // the definition's 64-row block
  const std::int64_t q0 = q_block * kBlockQ;
  const int row0 = warp * kWarpQ + g;  // this thread's rows in the block: row0 and row0 + 8

  // Key blocks past the last key any row of the CTA sees change nothing: skip them. A warpgroup
  // whose rows see none of a block's keys skips its arithmetic (but not its turns or its share of
  // the copies).
  std::int64_t key_end = a.seq_kv;
  if (a.causal) key_end = min(key_end, min(cta_q0 + kCtaQ, a.seq_q) + a.causal_offset);
  const int key_blocks = key_end <= 0 ? 0 : static_cast<int>((key_end + kBlockK - 1) / kBlockK);
  std::int64_t warpgroup_key_end = q0 < a.seq_q ? a.seq_kv : 0;
  if (a.causal) warpgroup_key_end = min(warpgroup_key_end, min(q0 + kBlockQ, a.seq_q) + a.causal_offset);

  const auto* q_src = static_cast<const std::uint8_t*>(a.q) + (head_q * a.q_rows + cta_q0) * Tile::kQkRowBytes;
  const auto* k_head = static_cast<const std::uint8_t*>(a.k) + head_kv * a.k_rows * Tile::kQkRowBytes;
  const auto* v_head = static_cast<const std::uint8_t*>(a.v) + head_kv * a.v_length * kDim * (Tile::kFp8Values ? 1 : 2);
  auto load_key_block = [&](int kb) {
    const std::int64_t first = static_cast<std::int64_t>(kb) * kBlockK;
    std::uint8_t* const sk = sk0 + (kb % Tile::kStages) * Tile::kSmemK;
    std::uint8_t* const sv = sv0 + (kb % Tile::kStages) * Tile::kSmemV;
    load_tile_async<kBlockK, Tile::kQkRowBytes, kThreads>(sk, k_head + first * Tile::kQkRowBytes, Tile::kQkRowBytes,
                                                static_cast<int>(min(static_cast<std::int64_t>(kBlockK), a.k_rows - first)));
    if constexpr (Tile::kFp8Values) {
      // v_length is a multiple of 128 with zeros past seq_kv: every block is whole.
      load_tile_async<kDim, kBlockK, kThreads>(sv, v_head + first, a.v_length, kDim);
    } else {
      load_tile_async<kBlockK, kDim * 2, kThreads>(sv, v_head + first * kDim * 2, kDim * 2,
                                         static_cast<int>(min(static_cast<std::int64_t>(kBlockK), a.v_length - first)));
    }
    cp_async_arrive(&stage_loaded[kb % Tile::kStages]);
  };

  if (threadIdx.x == 0)
    for (int stage = 0; stage < Tile::kStages; ++stage) mbarrier_init(&stage_loaded[stage], kThreads);
  __syncthreads();
  load_tile_async<kCtaQ, Tile::kQkRowBytes, kThreads>(sq, q_src, Tile::kQkRowBytes,
                                            static_cast<int>(min(static_cast<std::int64_t>(kCtaQ), a.q_rows - cta_q0)));
  if (key_blocks > 0) load_key_block(0);
  cp_async_wait_all();
  fence_proxy_async_shared();
  __syncthreads();  // Q has landed

  // Sage: the scale of this thread's query group (rows row0 and row0 + 8 share it under every
  // granularity). fa3: Q's and K's scales with the softmax scale, one factor for every score.
  float q_scale = 1.0f;
  float score_factor = a.score_scale;
  if constexpr (Tile::kInt8Scores) {
    if (q0 < a.q_rows) {
      std::int64_t group = q_block;
      if (a.granularity == Granularity::per_warp) group = q_block * 4 + warp;
      if (a.granularity == Granularity::per_thread) group = (q_block * 4 + warp) * 8 + g;
      q_scale = a.q_scale[head_q * a.q_groups + group];
    }
  }
  if constexpr (Tile::kFp8Scores) score_factor = a.q_scale[head_q] * a.k_scale[head_kv] * a.score_scale;

  // O's accumulator, m64n{kDim}: acc[4 dt + e] is row row0 + 8 (e / 2), column 8 dt + 2 t4 + e % 2.
  float acc[kDim / 2];
#pragma unroll
  for (int i = 0; i < kDim / 2; ++i) acc[i] = 0.0f;
  float row_max[2] = {-kInf, -kInf};
  float row_sum[2] = {0.0f, 0.0f};  // this thread's share of l; the quad's four add up at the end

  // Turns: a warpgroup issues its Q·Kᵀ, then its P·V, each in its turn, and passes the turn on
  // after issuing; in a key block, the order is Q·Kᵀ 0, Q·Kᵀ 1, P·V 0, P·V 1. Warpgroup 0 starts;
  // warpgroup 1 passes nothing after its last P·V, so every arrival is waited for.
  const int my_turn = 1 + warpgroup;
  const int other_turn = 2 - warpgroup;
  auto take_turn = [&] { named_barrier_sync(my_turn, kThreads); };
  auto pass_turn = [&] { named_barrier_arrive(other_turn, kThreads); };
  if (warpgroup == 1 && key_blocks > 0) pass_turn();

#pragma unroll 1
  for (int kb = 0; kb < key_blocks; ++kb) {
    mbarrier_wait(&stage_loaded[kb % Tile::kStages], (kb / Tile::kStages) & 1);
    fence_proxy_async_shared();
    // Each warpgroup loads its share of the next block once it holds the Q·Kᵀ turn of this one:
    // by then the other has finished block kb - 2, the last to use that stage.
    auto load_next_block = [&] {
      if (kb + 1 < key_blocks) load_key_block(kb + 1);
    };

    const std::int64_t key0 = static_cast<std::int64_t>(kb) * kBlockK;
    const bool passes_last_turn = warpgroup == 0 || kb + 1 < key_blocks;
    if (key0 >= warpgroup_key_end) {
      // Every key of the block hidden from these rows: no arithmetic, but the turns go round.
      take_turn();
      pass_turn();
      load_next_block();
      take_turn();
      if (passes_last_turn) pass_turn();
      continue;
    }
    const std::uint8_t* const sk = sk0 + (kb % Tile::kStages) * Tile::kSmemK;
    const std::uint8_t* const sv = sv0 + (kb % Tile::kStages) * Tile::kSmemV;

    // ---- S = Q·Kᵀ, scaled into the log2 domain; s[4 t + e] as acc, t the 8-key tile ----
    // Issued in this warpgroup's turn; the next block's copies go out while it runs (after the
    // turn is passed, as the stage argument above needs).
    auto multiply_q_k = [&](auto& scores) {
      take_turn();
      wgmma_fence();
#pragma unroll
      for (int c = 0; c < Tile::kQkSteps; ++c) {
        const std::uint64_t q_operand = k_major_operand<kCtaQ, Tile::kQkRowBytes>(sq, warpgroup * kBlockQ, c);
        const std::uint64_t k_operand = k_major_operand<kBlockK, Tile::kQkRowBytes>(sk, 0, c);
        if constexpr (Tile::kInt8Scores) wgmma_qk_s8(scores, q_operand, k_operand, c);
        else if constexpr (Tile::kFp8Scores) wgmma_qk_e4m3(scores, q_operand, k_operand, c);
        else if constexpr (std::is_same_v<Elem, __nv_bfloat16>) wgmma_qk_bf16(scores, q_operand, k_operand, c);
        else wgmma_qk_f16(scores, q_operand, k_operand, c);
      }
      wgmma_commit();
      pass_turn();
      load_next_block();
      wgmma_wait<0>();
      fence_registers(scores);
    };
    float s[4 * Tile::kScoreTiles];
    if constexpr (Tile::kInt8Scores) {
      int si[4 * Tile::kScoreTiles];
      multiply_q_k(si);
      const std::int64_t base = head_kv * a.k_groups;
      float k_scale0, k_scale1;  // by column parity: keys 2t and 2t + 1
      if (a.granularity == Granularity::per_thread) {
        k_scale0 = a.k_scale[base + kb * 8 + 2 * t4];
        k_scale1 = a.k_scale[base + kb * 8 + 2 * t4 + 1];
      } else {
        k_scale0 = k_scale1 = a.k_scale[base + kb];
      }
      const float qk_scale[2] = {q_scale * k_scale0, q_scale * k_scale1};
      // float(x) without I2F, a quarter-rate conversion on the pipe exp2 uses: for |x| < 2^22
      // (here |x| <= 127 * 127 * 128 < 2^21), 1.5 * 2^23 + x is a float whose bits are
      // 0x4B400000 + x, and subtracting 1.5 * 2^23 leaves x exactly.
#pragma unroll
      for (int i = 0; i < 4 * Tile::kScoreTiles; ++i)
        s[i] = (__int_as_float(0x4B400000 + si[i]) - 12582912.0f) * qk_scale[i & 1];
    } else {
      multiply_q_k(s);
#pragma unroll
      for (int i = 0; i < 4 * Tile::kScoreTiles; ++i) s[i] *= score_factor;
    }

    // ---- Hidden keys: past the end, or (causal) after the row's diagonal ----
    if (key0 + kBlockK > a.seq_kv || (a.causal && key0 + kBlockK - 1 > q0 + a.causal_offset)) {
      // Per row, the number of leading keys of this block it sees (0..128): 32-bit compares below.
      int visible[2];
#pragma unroll
      for (int rh = 0; rh < 2; ++rh) {
        std::int64_t end = a.seq_kv - key0;
        if (a.causal) end = min(end, q0 + row0 + rh * 8 + a.causal_offset + 1 - key0);
        visible[rh] = static_cast<int>(max(static_cast<std::int64_t>(0), min(end, static_cast<std::int64_t>(kBlockK))));
      }
#pragma unroll
      for (int t = 0; t < Tile::kScoreTiles; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (t * 8 + 2 * t4 + (e & 1) >= visible[e >> 1]) s[4 * t + e] = -kInf;
    }

    // ---- Online softmax (per row: the quad of threads holding it agrees on m) ----
    float alpha[2];
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      float block_max = -kInf;
#pragma unroll
      for (int t = 0; t < Tile::kScoreTiles; ++t) block_max = fmaxf(block_max, fmaxf(s[4 * t + 2 * rh], s[4 * t + 2 * rh + 1]));
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 1));
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 2));
      const float m_new = fmaxf(row_max[rh], block_max);
      // Every key hidden so far (m_new = -inf): exp2 against 0 gives p = 0 for the -inf scores,
      // without a branch; α is then 0 rather than the definition's 1, which changes nothing, as
      // acc and l are still 0.
      const float m_use = m_new == -kInf ? 0.0f : m_new;
      alpha[rh] = exp2_approx(row_max[rh] - m_use);
      float sum = 0.0f;
#pragma unroll
      for (int t = 0; t < Tile::kScoreTiles; ++t)
#pragma unroll
        for (int e = 2 * rh; e < 2 * rh + 2; ++e) {
          s[4 * t + e] = exp2_approx(s[4 * t + e] - m_use);
          sum += s[4 * t + e];
        }
      row_sum[rh] = row_sum[rh] * alpha[rh] + sum;  // l sums p unquantized
      row_max[rh] = m_new;
    }

    // ---- acc = acc·α + P·V ----
    // P as the A operand of each k-step: pa[c] is k16 chunk c (tiles 2c, 2c + 1) for 16-bit P, or
    // k32 chunk c (tiles 4c .. 4c + 3) for e4m3 P. An e4m3 register takes keys 2t, 2t + 1 of two
    // adjacent tiles, so its k order is a permutation of the keys, which the quantizer applied to
    // V's columns as well.
    std::uint32_t pa[Tile::kPvSteps][4];
    if constexpr (!Tile::kFp8Values) {
#pragma unroll
      for (int c = 0; c < Tile::kPvSteps; ++c) {
        pa[c][0] = pack2<Elem>(s[8 * c + 0], s[8 * c + 1]);
        pa[c][1] = pack2<Elem>(s[8 * c + 2], s[8 * c + 3]);
        pa[c][2] = pack2<Elem>(s[8 * c + 4], s[8 * c + 5]);
        pa[c][3] = pack2<Elem>(s[8 * c + 6], s[8 * c + 7]);
      }
    } else {
      // sage2 scales P by 448 into e4m3's range.
      constexpr float kPScale = Tile::kKind == Kind::sage2_int8_fp8 ? 448.0f : 1.0f;
#pragma unroll
      for (int c = 0; c < Tile::kPvSteps; ++c)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int lo = 4 * (4 * c + 2 * half), hi = lo + 4;  // the two 8-key tiles of this register pair
          pa[c][2 * half] = pack_e4m3x4(s[lo] * kPScale, s[lo + 1] * kPScale, s[hi] * kPScale, s[hi + 1] * kPScale);
          pa[c][2 * half + 1] =
              pack_e4m3x4(s[lo + 2] * kPScale, s[lo + 3] * kPScale, s[hi + 2] * kPScale, s[hi + 3] * kPScale);
        }
    }
    auto pv_step = [&](float(&d)[kDim / 2], int c, int accumulate) {
      if constexpr (Tile::kFp8Values) {
        const std::uint64_t v_operand = k_major_operand<kDim, kBlockK>(sv, 0, c);
        if constexpr (kDim == 64) wgmma_pv_e4m3_n64(d, pa[c], v_operand, accumulate);
        else wgmma_pv_e4m3_n128(d, pa[c], v_operand, accumulate);
      } else {
        const std::uint64_t v_operand = n_major_values_operand(sv, c);
        if constexpr (std::is_same_v<Elem, __nv_bfloat16> && kDim == 64) wgmma_pv_bf16_n64(d, pa[c], v_operand, accumulate);
        else if constexpr (std::is_same_v<Elem, __nv_bfloat16>) wgmma_pv_bf16_n128(d, pa[c], v_operand, accumulate);
        else if constexpr (kDim == 64) wgmma_pv_f16_n64(d, pa[c], v_operand, accumulate);
        else wgmma_pv_f16_n128(d, pa[c], v_operand, accumulate);
      }
    };
    if constexpr (Tile::kFp8Values && Tile::kPv == PvAccumulation::fp32) {
      // Straight into acc.
#pragma unroll
      for (int i = 0; i < kDim / 2; ++i) acc[i] *= alpha[(i >> 1) & 1];
      take_turn();
      wgmma_fence();
#pragma unroll
      for (int c = 0; c < Tile::kPvSteps; ++c) pv_step(acc, c, 1);
      wgmma_commit();
      if (passes_last_turn) pass_turn();
      wgmma_wait<0>();
      fence_registers(acc);
      fence_operand_rows(pa);
    } else {
      // This block's product summed afresh (fp32, or fp16 per 32-key chunk for fp32+fp16), then
      // added to acc, as the definition orders it.
      float o[kDim / 2];
      if constexpr (Tile::kFp8Values && Tile::kPv == PvAccumulation::fp32_fp16) {
        // V was scaled to 2.25 for this, so that a chunk stays inside fp16's range. The turn is
        // held over the four chunks.
#pragma unroll
        for (int i = 0; i < kDim / 2; ++i) o[i] = 0.0f;
        take_turn();
#pragma unroll
        for (int c = 0; c < Tile::kPvSteps; ++c) {
          std::uint32_t chunk[kDim / 4];  // half2: row row0 (even registers) or row0 + 8 (odd)
          wgmma_fence();
          const std::uint64_t v_operand = k_major_operand<kDim, kBlockK>(sv, 0, c);
          if constexpr (kDim == 64) wgmma_pv_e4m3_f16acc_n64(chunk, pa[c], v_operand, 0);
          else wgmma_pv_e4m3_f16acc_n128(chunk, pa[c], v_operand, 0);
          wgmma_commit();
          if (c + 1 == Tile::kPvSteps && passes_last_turn) pass_turn();
          wgmma_wait<0>();
          fence_registers(chunk);
#pragma unroll
          for (int r = 0; r < kDim / 4; ++r) {
            const float2 x = __half22float2(*reinterpret_cast<const __half2*>(&chunk[r]));
            o[2 * r] += x.x;
            o[2 * r + 1] += x.y;
          }
        }
        fence_operand_rows(pa);
      } else {
        take_turn();
        wgmma_fence();
#pragma unroll
        for (int c = 0; c < Tile::kPvSteps; ++c) pv_step(o, c, c);
        wgmma_commit();
        if (passes_last_turn) pass_turn();
        wgmma_wait<0>();
        fence_registers(o);
        fence_operand_rows(pa);
      }
#pragma unroll
      for (int i = 0; i < kDim / 2; ++i) acc[i] = acc[i] * alpha[(i >> 1) & 1] + o[i];
    }
  }
  cp_async_wait_all();  // with no key block, Q's copy is still in flight: none may outlive the CTA

  // ---- O = acc / l (times V's dequantization), rows with no visible key 0 ----
#pragma unroll
  for (int rh = 0; rh < 2; ++rh) {
    row_sum[rh] += __shfl_xor_sync(0xffffffffu, row_sum[rh], 1);
    row_sum[rh] += __shfl_xor_sync(0xffffffffu, row_sum[rh], 2);
  }
  Elem* out = static_cast<Elem*>(a.out) + head_q * a.seq_q * kDim;
#pragma unroll
  for (int rh = 0; rh < 2; ++rh) {
    const std::int64_t row = q0 + row0 + rh * 8;
    if (row >= a.seq_q) continue;
    const float l = row_sum[rh];
#pragma unroll
    for (int dt = 0; dt < Tile::kOutTiles; ++dt) {
      const int column = dt * 8 + 2 * t4;
      float o0 = l == 0.0f ? 0.0f : acc[4 * dt + 2 * rh] / l;
      float o1 = l == 0.0f ? 0.0f : acc[4 * dt + 2 * rh + 1] / l;
      if constexpr (Tile::kKind == Kind::sage2_int8_fp8) {
        o0 *= a.v_scale[head_kv * kDim + column];
        o1 *= a.v_scale[head_kv * kDim + column + 1];
      } else if constexpr (Tile::kKind == Kind::fa3_fp8) {
        o0 *= a.v_scale[head_kv];
        o1 *= a.v_scale[head_kv];
      }
      *reinterpret_cast<std::uint32_t*>(out + row * kDim + column) = pack2<Elem>(o0, o1);
    }
  }
}

template <class Tile>
void launch_attention(const AttentionArgs& a, cudaStream_t stream) {
  // Once per instantiation: more than 48 KB of dynamic shared memory must be asked for.
  static const cudaError_t configured = cudaFuncSetAttribute(
      attention_kernel<Tile>, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes);
  ATTNREPLAY_CUDA_CHECK(configured);
  const dim3 grid(static_cast<unsigned>(ceil_div(a.seq_q, Tile::kCtaQ)), static_cast<unsigned>(a.heads_q),
                  static_cast<unsigned>(a.batch));
  attention_kernel<Tile><<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(a);
  ATTNREPLAY_CUDA_CHECK_LAUNCH("attention_kernel");
}

// Picks the instantiation for the call's head dim and element type.
template <Kind kKind, PvAccumulation kPv>
void dispatch_attention(const AttentionArgs& a, cudaStream_t stream) {
  const bool bf16 = a.element == Element::bf16;
  if (a.head_dim == 64 && bf16) return launch_attention<AttentionTile<kKind, 64, __nv_bfloat16, kPv>>(a, stream);
  if (a.head_dim == 64) return launch_attention<AttentionTile<kKind, 64, __half, kPv>>(a, stream);
  if (a.head_dim == 128 && bf16) return launch_attention<AttentionTile<kKind, 128, __nv_bfloat16, kPv>>(a, stream);
  if (a.head_dim == 128) return launch_attention<AttentionTile<kKind, 128, __half, kPv>>(a, stream);
  throw std::invalid_argument("attention kernel: head dim " + std::to_string(a.head_dim) + " (64 or 128 only)");
}


}  // namespace attnreplay::cuda_attention
