#pragma once
// The attention kernel of all four kinds (docs/quantized.md), FlashAttention-2 style: a CTA of 4
// warps takes 64 query rows of one (batch, head), each warp 16 of them (Q stays in shared memory);
// keys come in blocks of 128 through shared memory (cp.async, V of a block loading while its
// scores are computed, K of the next while its P·V runs), in key order, with an online softmax in
// fp32 and exp2.
//
// Per warp and key block: S (16 x 128) = Q·Kᵀ by mma.sync, then scaled, masked, soft-maxed in
// registers, and P reused as the A operand of P·V straight from the score fragments:
//   flash  Q·Kᵀ m16n8k16 bf16/fp16 -> f32; P·V m16n8k16 bf16/fp16 -> f32
//   sage1  Q·Kᵀ m16n8k32 s8 -> s32;        P·V as flash
//   sage2  Q·Kᵀ as sage1;                  P·V m16n8k32 e4m3 -> f32 (-> f16 per 32 keys for fp32+fp16)
//   fa3    Q·Kᵀ m16n8k32 e4m3 -> f32;      P·V m16n8k32 e4m3 -> f32
// A thread's score fragment holds rows g and g + 8 of its warp tile and, in each 8-key tile, keys
// 2t and 2t + 1 (g = lane / 4, t = lane % 4): the INT8 per_thread groups of the definition.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/device_utils.cuh"

namespace attnreplay::cuda_attention {

template <Kind kKindT, int kDimT, typename ElementT, PvAccumulation kPvT>
struct AttentionTile {
  using Elem = ElementT;
  static constexpr Kind kKind = kKindT;
  static constexpr int kDim = kDimT;
  static constexpr PvAccumulation kPv = kPvT;
  static constexpr bool kInt8Scores = kKind == Kind::sage1_int8 || kKind == Kind::sage2_int8_fp8;
  static constexpr bool kFp8Scores = kKind == Kind::fa3_fp8;
  static constexpr bool kFp8Values = kKind == Kind::sage2_int8_fp8 || kKind == Kind::fa3_fp8;
  static constexpr int kQkRowBytes = kDim * (kInt8Scores || kFp8Scores ? 1 : 2);
  // 16 spare bytes a row put the 8 rows one ldmatrix reads on 8 different bank quads.
  static constexpr int kQkPitch = kQkRowBytes + 16;
  // One MMA k-step is 32 bytes of a row: k16 of 16-bit elements, k32 of 8-bit ones.
  static constexpr int kChunks = kQkRowBytes / 32;
  // 16-bit V as (key, channel) rows; e4m3 V as (channel, key) rows.
  static constexpr int kVRows = kFp8Values ? kDim : kBlockK;
  static constexpr int kVRowBytes = kFp8Values ? kBlockK : kDim * 2;
  static constexpr int kVPitch = kVRowBytes + 16;
  static constexpr int kSmemQ = kBlockQ * kQkPitch;
  static constexpr int kSmemK = kBlockK * kQkPitch;
  static constexpr int kSmemV = kVRows * kVPitch;
  static constexpr int kSmemBytes = kSmemQ + kSmemK + kSmemV;
  static constexpr int kScoreTiles = kBlockK / 8;
  static constexpr int kOutTiles = kDim / 8;
  static_assert(kDim == 64 || kDim == 128, "head dims 64 and 128");
};

// kRows rows of kRowBytes from `global` (row r at global + r * global_pitch) into shared memory
// with kPitch bytes a row; rows from valid_rows on are zero-filled.
template <int kRows, int kRowBytes, int kPitch>
__device__ __forceinline__ void load_tile_async(std::uint8_t* shared, const std::uint8_t* global,
                                                std::int64_t global_pitch, int valid_rows) {
  constexpr int kVectorsPerRow = kRowBytes / 16;
  constexpr int kVectors = kRows * kVectorsPerRow;
  static_assert(kVectors % kAttentionThreads == 0, "whole passes of the CTA");
#pragma unroll
  for (int i = 0; i < kVectors / kAttentionThreads; ++i) {
    const int vector = i * kAttentionThreads + static_cast<int>(threadIdx.x);
    const int row = vector / kVectorsPerRow;
    const int column = (vector % kVectorsPerRow) * 16;
    const bool valid = row < valid_rows;
    cp_async_16(shared + row * kPitch + column, valid ? global + row * global_pitch + column : global, valid);
  }
}

template <class Tile>
__global__ void __launch_bounds__(kAttentionThreads) attention_kernel(const AttentionArgs a) {
  using Elem = typename Tile::Elem;
  constexpr int kDim = Tile::kDim;
  constexpr float kInf = INFINITY;
  extern __shared__ __align__(16) std::uint8_t shared[];
  std::uint8_t* const sq = shared;
  std::uint8_t* const sk = shared + Tile::kSmemQ;
  std::uint8_t* const sv = sk + Tile::kSmemK;

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4;   // fragment row (and row + 8)
  const int t4 = lane % 4;  // fragment column pair
  const int lm = lane / 8;  // ldmatrix: the matrix whose row address this lane gives
  const int lr = lane % 8;  // ... and which row of it
  // Causal query blocks late in the sequence see the most keys: start them first, so that the
  // last wave is short.
  const std::int64_t q_block = static_cast<std::int64_t>(gridDim.x) - 1 - blockIdx.x;
  const int h = static_cast<int>(blockIdx.y);
  const int b = static_cast<int>(blockIdx.z);
  const int h_kv = h / (a.heads_q / a.heads_kv);
  const std::int64_t head_q = static_cast<std::int64_t>(b) * a.heads_q + h;
  const std::int64_t head_kv = static_cast<std::int64_t>(b) * a.heads_kv + h_kv;
  const std::int64_t q0 = q_block * kBlockQ;
  const int row0 = warp * kWarpQ + g;  // this thread's rows in the block: row0 and row0 + 8

  // Key blocks past the last key any row of this block sees change nothing: skip them.
  std::int64_t key_end = a.seq_kv;
  if (a.causal) key_end = min(key_end, min(q0 + kBlockQ, a.seq_q) + a.causal_offset);
  const int key_blocks = key_end <= 0 ? 0 : static_cast<int>((key_end + kBlockK - 1) / kBlockK);

  const auto* q_src = static_cast<const std::uint8_t*>(a.q) + (head_q * a.q_rows + q0) * Tile::kQkRowBytes;
  const auto* k_head = static_cast<const std::uint8_t*>(a.k) + head_kv * a.k_rows * Tile::kQkRowBytes;
  const auto* v_head = static_cast<const std::uint8_t*>(a.v) + head_kv * a.v_length * kDim * (Tile::kFp8Values ? 1 : 2);
  auto load_k = [&](int kb) {
    const std::int64_t first = static_cast<std::int64_t>(kb) * kBlockK;
    load_tile_async<kBlockK, Tile::kQkRowBytes, Tile::kQkPitch>(
        sk, k_head + first * Tile::kQkRowBytes, Tile::kQkRowBytes,
        static_cast<int>(min(static_cast<std::int64_t>(kBlockK), a.k_rows - first)));
  };
  auto load_v = [&](int kb) {
    const std::int64_t first = static_cast<std::int64_t>(kb) * kBlockK;
    if constexpr (Tile::kFp8Values) {
      // v_length is a multiple of 128 with zeros past seq_kv: every block is whole.
      load_tile_async<kDim, kBlockK, Tile::kVPitch>(sv, v_head + first, a.v_length, kDim);
    } else {
      load_tile_async<kBlockK, kDim * 2, Tile::kVPitch>(
          sv, v_head + first * kDim * 2, kDim * 2, static_cast<int>(min(static_cast<std::int64_t>(kBlockK), a.v_length - first)));
    }
  };

  load_tile_async<kBlockQ, Tile::kQkRowBytes, Tile::kQkPitch>(
      sq, q_src, Tile::kQkRowBytes, static_cast<int>(min(static_cast<std::int64_t>(kBlockQ), a.q_rows - q0)));
  if (key_blocks > 0) load_k(0);
  cp_async_commit();

  // Sage: the scale of this thread's query group (rows row0 and row0 + 8 share it under every
  // granularity). fa3: Q's and K's scales with the softmax scale, one factor for every score.
  float q_scale = 1.0f;
  float score_factor = a.score_scale;
  if constexpr (Tile::kInt8Scores) {
    std::int64_t group = q_block;
    if (a.granularity == Granularity::per_warp) group = q_block * 4 + warp;
    if (a.granularity == Granularity::per_thread) group = (q_block * 4 + warp) * 8 + g;
    q_scale = a.q_scale[head_q * a.q_groups + group];
  }
  if constexpr (Tile::kFp8Scores) score_factor = a.q_scale[head_q] * a.k_scale[head_kv] * a.score_scale;

  float acc[Tile::kOutTiles][4];
#pragma unroll
  for (int dt = 0; dt < Tile::kOutTiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[dt][e] = 0.0f;
  float row_max[2] = {-kInf, -kInf};
  float row_sum[2] = {0.0f, 0.0f};  // this thread's share of l; the quad's four add up at the end

  for (int kb = 0; kb < key_blocks; ++kb) {
    cp_async_wait_all();
    __syncthreads();  // K(kb) (and Q) have landed; every warp is done with V(kb - 1)
    load_v(kb);
    cp_async_commit();

    const std::int64_t key0 = static_cast<std::int64_t>(kb) * kBlockK;
    // ---- S = Q·Kᵀ, scaled into the log2 domain ----
    float s[Tile::kScoreTiles][4];
    float qk_scale[2] = {score_factor, score_factor};  // by column parity: keys 2t and 2t + 1
    if constexpr (Tile::kInt8Scores) {
      const std::int64_t base = head_kv * a.k_groups;
      float k_scale0, k_scale1;
      if (a.granularity == Granularity::per_thread) {
        k_scale0 = a.k_scale[base + kb * 8 + 2 * t4];
        k_scale1 = a.k_scale[base + kb * 8 + 2 * t4 + 1];
      } else {
        k_scale0 = k_scale1 = a.k_scale[base + kb];
      }
      qk_scale[0] = q_scale * k_scale0;
      qk_scale[1] = q_scale * k_scale1;
    }
    // Chunk-outer order: Q's fragment for one 32-byte k-step is read from shared memory once a
    // block and held for the 16 key tiles, rather than all of Q held in registers throughout
    // (which, beside S and acc, made the d = 128 kernels spill).
    const std::uint8_t* q_rows = sq + (warp * kWarpQ + lr + (lm & 1) * 8) * Tile::kQkPitch + (lm >> 1) * 16;
    // Key matrices: keys 16 t2 + 0..7 then + 8..15, each as the lower then upper 16 bytes of a chunk.
    const std::uint8_t* k_rows = sk + (lr + (lm >> 1) * 8) * Tile::kQkPitch + (lm & 1) * 16;
    if constexpr (Tile::kInt8Scores) {
      int si[Tile::kScoreTiles][4];
#pragma unroll
      for (int t = 0; t < Tile::kScoreTiles; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) si[t][e] = 0;
#pragma unroll
      for (int c = 0; c < Tile::kChunks; ++c) {
        std::uint32_t qa[4];
        ldmatrix_x4(qa, q_rows + c * 32);
#pragma unroll
        for (int t2 = 0; t2 < Tile::kScoreTiles / 2; ++t2) {
          std::uint32_t kf[4];
          ldmatrix_x4(kf, k_rows + t2 * 16 * Tile::kQkPitch + c * 32);
          mma_16832_s8(si[2 * t2], qa, kf[0], kf[1]);
          mma_16832_s8(si[2 * t2 + 1], qa, kf[2], kf[3]);
        }
      }
#pragma unroll
      for (int t = 0; t < Tile::kScoreTiles; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[t][e] = __int2float_rn(si[t][e]) * qk_scale[e & 1];
    } else {
#pragma unroll
      for (int t = 0; t < Tile::kScoreTiles; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[t][e] = 0.0f;
#pragma unroll
      for (int c = 0; c < Tile::kChunks; ++c) {
        std::uint32_t qa[4];
        ldmatrix_x4(qa, q_rows + c * 32);
#pragma unroll
        for (int t2 = 0; t2 < Tile::kScoreTiles / 2; ++t2) {
          std::uint32_t kf[4];
          ldmatrix_x4(kf, k_rows + t2 * 16 * Tile::kQkPitch + c * 32);
          if constexpr (Tile::kFp8Scores) {
            mma_16832_e4m3(s[2 * t2], qa, kf[0], kf[1]);
            mma_16832_e4m3(s[2 * t2 + 1], qa, kf[2], kf[3]);
          } else {
            mma_16816<Elem>(s[2 * t2], qa, kf[0], kf[1]);
            mma_16816<Elem>(s[2 * t2 + 1], qa, kf[2], kf[3]);
          }
        }
      }
#pragma unroll
      for (int t = 0; t < Tile::kScoreTiles; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[t][e] *= score_factor;
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
          if (t * 8 + 2 * t4 + (e & 1) >= visible[e >> 1]) s[t][e] = -kInf;
    }

    // ---- Online softmax (per row: the quad of threads holding it agrees on m) ----
    float alpha[2];
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      float block_max = -kInf;
#pragma unroll
      for (int t = 0; t < Tile::kScoreTiles; ++t) block_max = fmaxf(block_max, fmaxf(s[t][2 * rh], s[t][2 * rh + 1]));
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 1));
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 2));
      const float m_new = fmaxf(row_max[rh], block_max);
      float sum = 0.0f;
      if (m_new == -kInf) {
        // Every key hidden so far: p = 0, and nothing to rescale.
        alpha[rh] = 1.0f;
#pragma unroll
        for (int t = 0; t < Tile::kScoreTiles; ++t) s[t][2 * rh] = s[t][2 * rh + 1] = 0.0f;
      } else {
        alpha[rh] = exp2_approx(row_max[rh] - m_new);
#pragma unroll
        for (int t = 0; t < Tile::kScoreTiles; ++t)
#pragma unroll
          for (int e = 2 * rh; e < 2 * rh + 2; ++e) {
            s[t][e] = exp2_approx(s[t][e] - m_new);
            sum += s[t][e];
          }
      }
      row_sum[rh] = row_sum[rh] * alpha[rh] + sum;  // l sums p unquantized
      row_max[rh] = m_new;
    }

    cp_async_wait_all();
    __syncthreads();  // V(kb) has landed; every warp is done with K(kb)
    if (kb + 1 < key_blocks) {
      load_k(kb + 1);
      cp_async_commit();
    }

    // ---- acc = acc·α + P·V ----
    if constexpr (!Tile::kFp8Values) {
      // P rounded to the input dtype; k16 chunk c is score tiles 2c and 2c + 1.
      std::uint32_t pa[kBlockK / 16][4];
#pragma unroll
      for (int c = 0; c < kBlockK / 16; ++c) {
        pa[c][0] = pack2<Elem>(s[2 * c][0], s[2 * c][1]);
        pa[c][1] = pack2<Elem>(s[2 * c][2], s[2 * c][3]);
        pa[c][2] = pack2<Elem>(s[2 * c + 1][0], s[2 * c + 1][1]);
        pa[c][3] = pack2<Elem>(s[2 * c + 1][2], s[2 * c + 1][3]);
      }
#pragma unroll
      for (int dt2 = 0; dt2 < kDim / 16; ++dt2) {
        // This block's product for channels 16 dt2 .. + 15, summed afresh then added (as the
        // emulation does).
        float o0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, o1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int c = 0; c < kBlockK / 16; ++c) {
          std::uint32_t vf[4];
          // Transposed 8x8 matrices: keys 16c + 0..7 / + 8..15 of channels 16 dt2 + 0..7 / + 8..15.
          ldmatrix_x4_trans(vf, sv + (c * 16 + lr + (lm & 1) * 8) * Tile::kVPitch + (dt2 * 16 + (lm >> 1) * 8) * 2);
          mma_16816<Elem>(o0, pa[c], vf[0], vf[1]);
          mma_16816<Elem>(o1, pa[c], vf[2], vf[3]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          acc[2 * dt2][e] = acc[2 * dt2][e] * alpha[e >> 1] + o0[e];
          acc[2 * dt2 + 1][e] = acc[2 * dt2 + 1][e] * alpha[e >> 1] + o1[e];
        }
      }
    } else {
      // P in e4m3 (sage2: scaled by 448 into its range). k32 chunk c is score tiles 4c .. 4c + 3;
      // a register of the A fragment takes keys 2t, 2t + 1 of two adjacent tiles, so its k order
      // is a permutation of the keys, which the quantizer applied to V's columns as well.
      constexpr float kPScale = Tile::kKind == Kind::sage2_int8_fp8 ? 448.0f : 1.0f;
      std::uint32_t pa[kBlockK / 32][4];
#pragma unroll
      for (int c = 0; c < kBlockK / 32; ++c) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int lo = 4 * c + 2 * half, hi = lo + 1;  // the two 8-key tiles of this register pair
          pa[c][2 * half] = pack_e4m3x4(s[lo][0] * kPScale, s[lo][1] * kPScale, s[hi][0] * kPScale, s[hi][1] * kPScale);
          pa[c][2 * half + 1] =
              pack_e4m3x4(s[lo][2] * kPScale, s[lo][3] * kPScale, s[hi][2] * kPScale, s[hi][3] * kPScale);
        }
      }
      // Channels 16 dt2 + 0..7 / + 8..15, each the lower then upper 16 keys of chunk c.
      auto v_fragment = [&](std::uint32_t(&vf)[4], int dt2, int c) {
        ldmatrix_x4(vf, sv + (dt2 * 16 + lr + (lm >> 1) * 8) * Tile::kVPitch + c * 32 + (lm & 1) * 16);
      };
      if constexpr (Tile::kPv == PvAccumulation::fp32) {
        // Straight into acc.
#pragma unroll
        for (int dt = 0; dt < Tile::kOutTiles; ++dt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[dt][e] *= alpha[e >> 1];
#pragma unroll
        for (int dt2 = 0; dt2 < kDim / 16; ++dt2)
#pragma unroll
          for (int c = 0; c < kBlockK / 32; ++c) {
            std::uint32_t vf[4];
            v_fragment(vf, dt2, c);
            mma_16832_e4m3(acc[2 * dt2], pa[c], vf[0], vf[1]);
            mma_16832_e4m3(acc[2 * dt2 + 1], pa[c], vf[2], vf[3]);
          }
      } else {
#pragma unroll
        for (int dt2 = 0; dt2 < kDim / 16; ++dt2) {
          // A fresh accumulator for this block (fp32, or fp16 for fp32+fp16), then added to acc.
          float o0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, o1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          if constexpr (Tile::kPv == PvAccumulation::fp32_fp16) {
            // Each 32-key chunk into a fresh fp16 accumulator (V was scaled to 2.25 for this, so
            // that a chunk stays inside fp16's range), then added to the block's fp32 sum.
#pragma unroll
            for (int c = 0; c < kBlockK / 32; ++c) {
              std::uint32_t vf[4];
              v_fragment(vf, dt2, c);
              std::uint32_t h0[2] = {0u, 0u}, h1[2] = {0u, 0u};
              mma_16832_e4m3_f16(h0, pa[c], vf[0], vf[1]);
              mma_16832_e4m3_f16(h1, pa[c], vf[2], vf[3]);
#pragma unroll
              for (int rh = 0; rh < 2; ++rh) {
                const float2 x0 = __half22float2(*reinterpret_cast<const __half2*>(&h0[rh]));
                const float2 x1 = __half22float2(*reinterpret_cast<const __half2*>(&h1[rh]));
                o0[2 * rh] += x0.x;
                o0[2 * rh + 1] += x0.y;
                o1[2 * rh] += x1.x;
                o1[2 * rh + 1] += x1.y;
              }
            }
          } else {
#pragma unroll
            for (int c = 0; c < kBlockK / 32; ++c) {
              std::uint32_t vf[4];
              v_fragment(vf, dt2, c);
              mma_16832_e4m3(o0, pa[c], vf[0], vf[1]);
              mma_16832_e4m3(o1, pa[c], vf[2], vf[3]);
            }
          }
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            acc[2 * dt2][e] = acc[2 * dt2][e] * alpha[e >> 1] + o0[e];
            acc[2 * dt2 + 1][e] = acc[2 * dt2 + 1][e] * alpha[e >> 1] + o1[e];
          }
        }
      }
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
      float o0 = l == 0.0f ? 0.0f : acc[dt][2 * rh] / l;
      float o1 = l == 0.0f ? 0.0f : acc[dt][2 * rh + 1] / l;
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
  const dim3 grid(static_cast<unsigned>(ceil_div(a.seq_q, kBlockQ)), static_cast<unsigned>(a.heads_q),
                  static_cast<unsigned>(a.batch));
  attention_kernel<Tile><<<grid, kAttentionThreads, Tile::kSmemBytes, stream>>>(a);
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
