#pragma once
// The attention kernel of all four kinds (docs/quantized.md), for Hopper's warpgroup MMA (sm_90a).
// A CTA takes 64 query rows of one (batch, head) per consumer warpgroup (two or three, as
// AttentionTile says) with a producer warpgroup, whose one thread copies Q once and K and V block
// by block into three shared-memory stages by TMA. Each consumer computes one 64-row block of the
// definition (each of its 4 warps 16 rows of it) over the key blocks of 128 in order, with an
// online softmax in fp32 and exp2. The producer gives its registers to the consumers
// (setmaxnreg). Stages pass between them on mbarriers: "loaded" (the copy engine counts the bytes
// in) and "free" (every consumer thread arrives once done). A solo CTA (sage2) is one consumer
// that copies for itself, three or four CTAs to an SM. One launch may cover several calls of batch
// 1 (a batch's sequences), grid z a call, each call's parameters read from global memory.
//
// Overlapped schedule: the consumers take turns to issue their MMAs (FlashAttention-3's
// ping-pong); in one turn a consumer issues Q·Kᵀ of block kb and P·V of block kb - 1, so while one
// computes its softmax the others' products keep the tensor cores busy. Serial schedule: each
// consumer issues P·V right after its softmax and waits for it; three consumers interleave. Per
// consumer and key block: S (64 x 128) = Q·Kᵀ by wgmma with Q and K in shared memory, then masked
// and soft-maxed in registers (scaled inside exp2's FFMA), and P kept in registers as P·V's A
// operand:
//   flash  Q·Kᵀ k16 bf16/fp16 -> f32; P·V k16 bf16/fp16 -> f32, straight into acc
//   sage1  Q·Kᵀ k32 s8 -> s32;        P·V as flash
//   sage2  Q·Kᵀ as sage1;             P·V k32 e4m3 -> f32 (fp32: into acc; fp32+fp32: a fresh
//                                     accumulator per block; fp32+fp16: f16 per 32 keys)
//   fa3    Q·Kᵀ k32 e4m3 -> f32;      P·V k32 e4m3 -> f32, a fresh accumulator per block
// A warpgroup MMA's accumulator gives each warp its 16 rows laid out as mma.sync's m16n8 C
// fragment: a thread holds rows g and g + 8 and, in each 8-key tile, keys 2t and 2t + 1
// (g = lane / 4, t = lane % 4), the INT8 per_thread groups of the definition; and its register A
// operand is laid out as mma.sync's A fragment, so P goes from one to the other in registers.
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/wgmma.cuh"

namespace attnreplay::cuda_attention {

template <QuantizedKind kKindT, int kDimT, typename ElementT, PvAccum kPvT, bool kPerThreadKT = false>
struct AttentionTile {
  using Elem = ElementT;
  static constexpr QuantizedKind kKind = kKindT;
  static constexpr int kDim = kDimT;
  // A consumer warpgroup per 64-row query block, and one producer warpgroup. Three schedules:
  // - overlapped (flash at head dim 128; all but sage2 at 64): the consumers take turns on the
  //   tensor cores, and a turn issues Q·Kᵀ of a block with P·V of the block before, so that a
  //   consumer's P·V runs under its next softmax. Two consumers at head dim 128, each's softmax
  //   hidden behind the other's MMAs; three at 64, whose MMAs are half as long.
  // - serial (sage1 and fa3 at head dim 128): each consumer issues P·V right after its
  //   softmax and waits for it, as SageAttention2's Hopper kernel does, which frees the registers
  //   the overlap holds (the scores of one block and the P·V of another) for a third consumer,
  //   and the three interleave on their own. On an H100, from 4k keys up: sage2 +8-11 %, fa3
  //   +3-5 %, sage1 +2-5 % (bench/results/experiments.md: 2026-11-23-h100-serial). flash's 16-bit Q and K would
  //   need more shared memory than a CTA has for a third consumer.
  // - solo (sage2): the serial schedule in a CTA of one consumer warpgroup and no producer, three
  //   such CTAs to an SM at head dim 128 (168 registers each, as SageAttention2's Hopper kernel
  //   runs), four at 64 (128 registers); two at 128 under fp32+fp16, whose fp16 accumulator of
  //   a 32-key chunk spilled 64-76 bytes at 168 registers (with 248 and no spills: Flux +4 %,
  //   1k and 4k even; bench/results/experiments.md: 2026-11-25-h100-whole-call). Its first thread copies K once
  //   Q·Kᵀ is done with it and V once P·V is, one stage each. Every CTA copies its own K and V, three times the L2 reads
  //   of the shared-CTA serial schedule, but 64-row CTAs fill the last wave of a launch more
  //   evenly than 192-row ones. On an H100 (bench/results/experiments.md: 2026-11-23-h100-solo), against the
  //   shared-CTA schedules: +12 % on Flux (4.4 waves of 192-row CTAs), +22 % at 1k keys, +4 % at
  //   4k, even at 16k; at head dim 64 +5 % on CogVideoX and +16 % at 4250 keys (three CTAs: -3 %,
  //   +6 %). The other kinds lost under it: fa3 5-45 % at head dim 128 (its block sums spill at
  //   168 registers); at 64, on CogVideoX, fa3, sage1 and flash 5-17 % (at most +3 % at 4250
  //   keys); sage1's 16-bit V would leave room for only two CTAs at 128.
  static constexpr bool kInt8Scores = kKind == QuantizedKind::sage1_int8 || kKind == QuantizedKind::sage2_int8_fp8;
  static constexpr bool kFp8Scores = kKind == QuantizedKind::fa3_fp8;
  static constexpr bool kFp8Values = kKind == QuantizedKind::sage2_int8_fp8 || kKind == QuantizedKind::fa3_fp8;
  static constexpr bool kSolo = kKindT == QuantizedKind::sage2_int8_fp8;
  // sage2 quantizes its Q block itself, from the uploaded Q (QuantizedQBlock): the preparation
  // then neither reads Q nor writes its codes. A solo CTA's one warpgroup does it once, before its
  // first key block.
  static constexpr bool kQuantizesQ = kSolo;
  static constexpr bool kSerial = kSolo || (kDimT == 128 && kKindT != QuantizedKind::flash);
  static constexpr int kConsumers = kSolo ? 1 : kDim == 64 || kSerial ? 3 : 2;
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr int kThreads = kConsumerThreads + (kSolo ? 0 : 128);
  static constexpr int kCtasPerSm = kSolo ? (kDimT == 64 ? 4 : (kPvT == PvAccum::fp32_fp16 ? 2 : 3)) : 1;
  static constexpr int kCtaQ = kBlockQ * kConsumers;
  // Solo: whether the wait for V comes after the softmax (see parity_after), or where ptxas puts
  // it, at the softmax's start. On an H100 (bench/results/experiments.md: 2026-11-23-h100-late-values): at head
  // dim 64, where the softmax is short and V more often still on its way, +1-2 %; at 128, -1-2 %
  // (four more instructions, and the wait then waits for the row sums).
  static constexpr bool kValuesWaitAfterSoftmax = kSolo && kDimT == 64;
  // Serial: whether the blocks without hidden keys run in a loop of their own, without the masking
  // test. Solo at head dim 64: 19 instructions fewer a block (ptxas keeps more of the addressing
  // in uniform registers); at 128, 14 more (and a spill).
  static constexpr bool kSeparateMaskedLoop = kSolo && kDimT == 64;
  // The register file (64 K) split: 24 x 128 + 240 x 256, or 32 x 128 + 160 x 384; the producer
  // needs few.
  static constexpr int kProducerRegisters = kConsumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegisters = kConsumers == 2 ? 240 : 160;
  static constexpr PvAccum kPv = kPvT;
  // Sage: K's scales per_thread (keys 2t and 2t + 1 of a block in groups of their own, two
  // factors) or one per block (per_warp, per_block). A compile-time choice: with one factor the
  // loop is 8-10 instructions shorter than when the choice was made at run time and, on an
  // H100, 1-3 % faster (bench/results/experiments.md: 2026-11-23-h100-softmax).
  static constexpr bool kPerThreadK = kPerThreadKT;
  static_assert(!kPerThreadK || kInt8Scores, "per_thread K scales are the Sage kinds'");
  // How P·V reaches acc: 16-bit MMAs accumulate in fp32 exactly as the definition does, straight
  // into acc; the FP8 kinds sum each block in a fresh accumulator first (Hopper's FP8 MMA keeps
  // fewer bits than fp32 when it adds), except sage2 asked for fp32 (straight) or fp32+fp16.
  static constexpr bool kChunkedPv = kKind == QuantizedKind::sage2_int8_fp8 && kPv == PvAccum::fp32_fp16;
  static constexpr bool kBlockSumPv =
      (kKind == QuantizedKind::sage2_int8_fp8 && kPv == PvAccum::fp32_fp32) || kKind == QuantizedKind::fa3_fp8;
  // sage2 scales P by 448 into e4m3's range inside exp2: exp2(x + log2 448), and l with it.
  static constexpr float kLog2PScale = kKind == QuantizedKind::sage2_int8_fp8 ? 8.80735492205760410f : 0.0f;
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
  // Three stages of K and V (one each in a solo CTA, three CTAs to an SM); 1024 spare bytes to
  // align the first tile.
  static constexpr int kStages = kSolo ? 1 : 3;
  static constexpr int kSmemBytes = kSmemQ + kStages * (kSmemK + kSmemV) + 1024;
  static constexpr int kScoreTiles = kBlockK / 8;
  static constexpr int kOutTiles = kDim / 8;
  static_assert(kDim == 64 || kDim == 128, "head dims 64 and 128");
  static_assert(kCtasPerSm * (kSmemBytes + 1024) <= 228 * 1024, "at most 228 KB of shared memory per SM on Hopper, 1 KB of it per CTA reserved");
  static_assert(kSmemQ % 1024 == 0 && kSmemK % 1024 == 0 && kSmemV % 1024 == 0, "tiles on 1024-byte boundaries");
};

// Shared-memory tiles are laid out as TMA writes them and the MMA descriptors read them: rows of
// 128 bytes (wider rows split into 128-byte column blocks, one after the other, each kRows rows)
// or of 64 bytes, the 16-byte chunks of each 8 rows permuted by the 128-byte (64-byte) swizzle,
// which spreads a column of chunks over all banks. The tile starts on a 1024-byte boundary: the
// hardware swizzles by address bits. kSwizzleBytes is both the swizzle and a column block's width.
template <int kRowBytes>
inline constexpr int kSwizzleBytes = kRowBytes >= 128 ? 128 : 64;
// Where 16-byte chunk `chunk` of row `row` of a tile of kRowBytes-byte rows (at most 128) lies:
// the swizzle XORs the chunk's index with the address bits above a 128-byte line, 3 of them for
// the 128-byte swizzle, 2 for the 64-byte one.
template <int kRowBytes>
__device__ __forceinline__ int swizzled_offset(int row, int chunk) {
  static_assert(kRowBytes == 128 || kRowBytes == 64, "one column block: rows of 64 or 128 bytes");
  const int line_bits = kRowBytes == 128 ? row & 7 : (row >> 1) & 3;
  return row * kRowBytes + (chunk ^ line_bits) * 16;
}

// A tile of kRows rows from row `row` of head `head`: one TMA box per 128-byte column block.
template <int kRows, int kRowBytes>
__device__ __forceinline__ void load_tile(std::uint8_t* tile, const CUtensorMap& map, std::int64_t row, std::int64_t head,
                                          std::uint64_t* loaded, bool issue = true) {
  constexpr int kBoxBytes = kSwizzleBytes<kRowBytes>;
#pragma unroll
  for (int block = 0; block < kRowBytes / kBoxBytes; ++block)
    tma_load_3d(tile + block * kRows * kBoxBytes, &map, block * kBoxBytes, static_cast<int>(row), static_cast<int>(head),
                loaded, issue);
}

// MMA operands are a tile's descriptor (made once, before the key loop) moved on by a byte offset
// (a stage, a k-step, a consumer's rows): an add a descriptor, where making each descriptor afresh
// cost sage2's key block at head dim 128 32 more instructions (565 rather than 533) and, on an
// H100, 0.3-1.4 % of its time (bench/results/experiments.md: 2026-11-26-h100-descriptors-once). Only the start
// address (bits 0-13, in 16-byte units) moves; it cannot carry into the fields above it, shared
// memory being under 256 KB.
__device__ __forceinline__ std::uint64_t descriptor_at(std::uint64_t tile_descriptor, int bytes) {
  const std::uint32_t start = static_cast<std::uint32_t>(tile_descriptor) + static_cast<std::uint32_t>(bytes >> 4);
  return (tile_descriptor & 0xFFFFFFFF00000000ull) | start;
}

// A K-major tile (Q, K, and e4m3 V), and the offset of one 32-byte k-step's operand in it, rows
// first_row.. of it: consecutive 8-row groups are 8 rows' bytes apart; the k-step moves the start
// within the row.
template <int kRowBytes>
__device__ __forceinline__ std::uint64_t k_major_tile(const std::uint8_t* tile) {
  return matrix_descriptor(shared_address(tile), 16, 8 * kSwizzleBytes<kRowBytes>, kSwizzleBytes<kRowBytes>);
}
template <int kRows, int kRowBytes>
__device__ __forceinline__ constexpr int k_major_offset(int first_row, int step) {
  constexpr int kColumnBlockBytes = kSwizzleBytes<kRowBytes>;
  const int byte = step * 32;
  return (byte / kColumnBlockBytes) * kRows * kColumnBlockBytes + first_row * kColumnBlockBytes +
         byte % kColumnBlockBytes;
}

// 16-bit V as (key, channel) rows read N-major, and the offset of one k16 step's B operand: 16 keys
// are two 8-key groups 1024 bytes apart; 64-channel column blocks follow each other at a block's
// size.
__device__ __forceinline__ std::uint64_t n_major_values_tile(const std::uint8_t* tile) {
  return matrix_descriptor(shared_address(tile), kBlockK * 128, 1024, 128);
}
__device__ __forceinline__ constexpr int n_major_values_offset(int step) { return step * 16 * 128; }

// fence_registers for P's register operands, one row of 4 per k-step.
template <int kSteps>
__device__ __forceinline__ void fence_operand_rows(std::uint32_t (&pa)[kSteps][4]) {
#pragma unroll
  for (int c = 0; c < kSteps; ++c) fence_registers(pa[c]);
}

// A solo CTA's 64-row Q block from the uploaded Q (16-bit, the call's layout) to INT8 codes in
// shared memory, laid out as TMA copies the prepared codes (rows of kDim bytes in the 128- or
// 64-byte swizzle), by the preparation's arithmetic (quantize.cu's int8_block_codes): x = Q ·
// score_scale, a group's scale amax / 127, its codes round(x · 127 / amax), rows past the end
// coded 0 and left out of the maxima. A warp takes its 16 rows, two lanes a row: lane l half
// (l % 2) of row l / 2. load() reads the rows into registers (zeros past the end); code() writes
// the codes, every bit as the preparation's (bench/same_outputs.py), and gives the scale of the
// thread's fragment rows (row0, row0 + 8), which share a group under every granularity.
template <class Tile>
struct QuantizedQBlock {
  using Elem = typename Tile::Elem;
  static constexpr int kDim = Tile::kDim;
  static constexpr int kHalfRow = kDim / 2;       // elements a lane
  static constexpr int kVectors = kHalfRow / 8;   // 16-byte loads a lane
  uint4 raw[kVectors];
  int row = 0;  // in the block

  __device__ __forceinline__ void load(const AttentionArgs& a, std::int64_t q0, int h, int b) {
    static_assert(Tile::kCtaQ == kBlockQ && Tile::kThreads == 128, "one warpgroup, one 64-row block");
    const int lane = static_cast<int>(threadIdx.x) % 32;
    row = static_cast<int>(threadIdx.x) / 32 * kWarpQ + lane / 2;
    const bool inside = q0 + row < a.seq_q;
    const Elem* source = static_cast<const Elem*>(a.q) + b * a.q_stride_b + h * a.q_stride_h +
                         (inside ? q0 + row : 0) * a.q_stride_s + lane % 2 * kHalfRow;
#pragma unroll
    for (int v = 0; v < kVectors; ++v) raw[v] = inside ? __ldcs(reinterpret_cast<const uint4*>(source) + v) : uint4{};
  }

  __device__ __forceinline__ float code(const AttentionArgs& a, std::uint8_t* sq, float* warp_amax) const {
    using Pair = std::conditional_t<std::is_same_v<Elem, __nv_bfloat16>, __nv_bfloat162, __half2>;
    const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
    // max |x| is fl(max |Q| · |score_scale|): the maximum is exact on the 16-bit values, two at a
    // time, and rounding a product is monotonic. NaNs are passed over, as fmaxf does. Rows past the
    // end were loaded as zeros.
    Pair pair_max;
    *reinterpret_cast<std::uint32_t*>(&pair_max) = 0u;  // +0, +0
#pragma unroll
    for (int v = 0; v < kVectors; ++v) {
      const Pair* pairs = reinterpret_cast<const Pair*>(&raw[v]);
#pragma unroll
      for (int k = 0; k < 4; ++k) pair_max = __hmax2(pair_max, __habs2(pairs[k]));
    }
    float amax = __fmul_rn(fmaxf(to_float(pair_max.x), to_float(pair_max.y)), fabsf(a.score_scale));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));  // the row
    // per_thread: rows r and r + 8 of the warp tile (lanes l and l ^ 16); else the warp's 16 rows,
    // and per_block the 4 warps' too.
    if (a.granularity == QuantGranularity::per_thread) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 16));
    } else {
#pragma unroll
      for (int offset = 2; offset < 32; offset *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    }
    if (a.granularity == QuantGranularity::per_block) {
      if (lane == 0) warp_amax[warp] = amax;
      __syncthreads();
      amax = fmaxf(fmaxf(warp_amax[0], warp_amax[1]), fmaxf(warp_amax[2], warp_amax[3]));
    }
    const float inverse = amax == 0.0f ? 0.0f : __fdiv_rn(127.0f, amax);
    // Each 16-byte chunk of codes: code_of(x) has the code in its low byte.
    auto store_codes = [&](auto code_of) {
#pragma unroll
      for (int chunk = 0; chunk < kVectors / 2; ++chunk) {
        std::uint32_t word[4];
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          std::uint32_t code[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const int element = 4 * w + k;
            const Elem e = reinterpret_cast<const Elem*>(&raw[2 * chunk + element / 8])[element % 8];
            code[k] = code_of(__fmul_rn(to_float(e), a.score_scale));
          }
          word[w] = pack_low_bytes(code[0], code[1], code[2], code[3]);
        }
        const int column = lane % 2 * (kVectors / 2) + chunk;
        *reinterpret_cast<uint4*>(sq + swizzled_offset<Tile::kQkRowBytes>(row, column)) =
            uint4{word[0], word[1], word[2], word[3]};
      }
    };
    if (inverse != INFINITY) {
      // |x · inverse| rounds to at most 127, so nothing needs clamping.
      store_codes([&](float x) { return int8_code_bits(__fmul_rn(x, inverse)); });
    } else {  // max |x| below fp32's normal range: x · inverse is ±inf, which must clamp to ±127
      store_codes([&](float x) { return int8_code_bits_clamped(__fmul_rn(x, inverse)); });
    }
    // The fragment rows' group: this lane's under per_warp and per_block; under per_thread, that of
    // row g = lane / 4, whose lanes include 2g.
    const float group_amax = __shfl_sync(0xffffffffu, amax, lane / 4 * 2);
    return __fdiv_rn(group_amax, 127.0f);
  }
};

// The launch's call, or (kParts) grid z's call of several, whose parameters are in global memory.
template <bool kParts>
__device__ __forceinline__ const AttentionParams& call_parameters(const AttentionParams& launch) {
  if constexpr (kParts) return launch.parts[blockIdx.z];
  else return launch;
}

template <class Tile, bool kParts>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kCtasPerSm) attention_kernel(const __grid_constant__ AttentionParams launch) {
  using Elem = typename Tile::Elem;
  const AttentionParams& params = call_parameters<kParts>(launch);
  const AttentionArgs& a = params.args;
  constexpr int kDim = Tile::kDim;
  constexpr float kInf = INFINITY;
  constexpr int kCtaQ = Tile::kCtaQ;
  constexpr int kStages = Tile::kStages;
  extern __shared__ std::uint8_t shared_bytes[];
  std::uint8_t* const sq = shared_bytes + ((1024 - (shared_address(shared_bytes) & 1023)) & 1023);
  std::uint8_t* const sk0 = sq + Tile::kSmemQ;
  std::uint8_t* const sv0 = sk0 + kStages * Tile::kSmemK;
  __shared__ std::uint64_t q_loaded;
  __shared__ std::uint64_t stage_loaded[kStages];  // the producer's arrival and the copies' bytes
  __shared__ std::uint64_t stage_free[kStages];    // every consumer thread, once done with the stage
  // Solo CTAs copy K and V apart, K once Q·Kᵀ is done with it, V once P·V is: stage_loaded is
  // then K's, this V's, and stage_free unused (the warpgroup syncs instead).
  __shared__ std::uint64_t values_loaded[Tile::kSolo ? kStages : 1];

  // Through a shuffle, so that the compiler knows it uniform in a warp: MMAs issued under a branch
  // it cannot prove uniform are serialized.
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  // Causal query blocks late in the sequence see the most keys: start them first, so that the
  // last wave is short.
  const std::int64_t cta_block = static_cast<std::int64_t>(gridDim.x) - 1 - blockIdx.x;
  // A call of several has batch 1 and may have fewer query blocks than the grid's (the longest's):
  // the CTAs past its own leave before anything.
  if (kParts && cta_block * kCtaQ >= a.seq_q) return;
  const int h = static_cast<int>(blockIdx.y);
  const int b = kParts ? 0 : static_cast<int>(blockIdx.z);
  const int h_kv = h / (a.heads_q / a.heads_kv);
  const std::int64_t head_q = static_cast<std::int64_t>(b) * a.heads_q + h;
  const std::int64_t head_kv = static_cast<std::int64_t>(b) * a.heads_kv + h_kv;
  const std::int64_t cta_q0 = cta_block * kCtaQ;
  // Key blocks past the last key any row of the CTA sees change nothing: skip them.
  std::int64_t key_end = a.seq_kv;
  if (a.causal) key_end = min(key_end, min(cta_q0 + kCtaQ, a.seq_q) + a.causal_offset);
  const int key_blocks = key_end <= 0 ? 0 : static_cast<int>((key_end + kBlockK - 1) / kBlockK);

  if (threadIdx.x == 0) {
    mbarrier_init(&q_loaded, 1);
    for (int stage = 0; stage < kStages; ++stage) {
      mbarrier_init(&stage_loaded[stage], 1);
      mbarrier_init(&stage_free[stage], Tile::kConsumerThreads);
      if constexpr (Tile::kSolo) mbarrier_init(&values_loaded[stage], 1);
    }
    fence_mbarrier_init();
  }
  // sage2's Q rows are read before the wait: they are the uploaded Q, which no kernel writes.
  [[maybe_unused]] QuantizedQBlock<Tile> q_block_rows;
  if constexpr (Tile::kQuantizesQ) q_block_rows.load(a, cta_q0, h, b);
  __syncthreads();
  wait_for_prior_kernel();  // launched overlapping its inputs' preparation: before any copy of them

  // Copies by TMA, issued by the threads where `issue` holds: Q; K or V of key block kb into its
  // stage, the bytes counted on `loaded`.
  auto load_q = [&](bool issue) {
    mbarrier_arrive_expect_bytes(&q_loaded, Tile::kSmemQ, issue);
    load_tile<kCtaQ, Tile::kQkRowBytes>(sq, params.q_map, cta_q0, head_q, &q_loaded, issue);
  };
  auto copy_keys = [&](int kb, std::uint64_t* loaded, bool issue) {
    load_tile<kBlockK, Tile::kQkRowBytes>(sk0 + kb % kStages * Tile::kSmemK, params.k_map,
                                          static_cast<std::int64_t>(kb) * kBlockK, head_kv, loaded, issue);
  };
  auto copy_values = [&](int kb, std::uint64_t* loaded, bool issue) {
    std::uint8_t* const tile = sv0 + kb % kStages * Tile::kSmemV;
    if constexpr (Tile::kFp8Values) {
      // (channel, key) rows: the box starts at key kb · 128 of channel 0.
      tma_load_3d(tile, &params.v_map, kb * kBlockK, 0, static_cast<int>(head_kv), loaded, issue);
    } else {
      load_tile<kBlockK, kDim * 2>(tile, params.v_map, static_cast<std::int64_t>(kb) * kBlockK, head_kv, loaded, issue);
    }
  };
  // Solo CTAs copy for themselves, K and V apart, each once the warpgroup is done with the block
  // its stage held: by the first thread, without a thread-dependent branch, which would cost the
  // loop its warp-uniform address arithmetic.
  const bool first_thread = threadIdx.x == 0;
  auto load_keys = [&](int kb) {
    const bool issue = first_thread && kb < key_blocks;
    mbarrier_arrive_expect_bytes(&stage_loaded[kb % kStages], Tile::kSmemK, issue);
    copy_keys(kb, &stage_loaded[kb % kStages], issue);
  };
  auto load_values = [&](int kb) {
    const bool issue = first_thread && kb < key_blocks;
    mbarrier_arrive_expect_bytes(&values_loaded[kb % kStages], Tile::kSmemV, issue);
    copy_values(kb, &values_loaded[kb % kStages], issue);
  };

  if constexpr (Tile::kSolo) {
    if constexpr (!Tile::kQuantizesQ) load_q(first_thread);
    for (int kb = 0; kb < kStages; ++kb) {  // blocks past key_blocks: load_* issue nothing
      load_keys(kb);
      load_values(kb);
    }
  } else if (warpgroup == Tile::kConsumers) {
    // ---- Producer: one thread issues every copy; a stage is refilled once every consumer is
    // done with the block it held ----
    registers_decrease_to<Tile::kProducerRegisters>();
    if (threadIdx.x % 128 != 0) return;
    load_q(true);
#pragma unroll 1
    for (int kb = 0; kb < key_blocks; ++kb) {
      const int stage = kb % kStages;
      if (kb >= kStages) mbarrier_wait(&stage_free[stage], (kb / kStages - 1) & 1);
      mbarrier_arrive_expect_bytes(&stage_loaded[stage], Tile::kSmemK + Tile::kSmemV);
      copy_keys(kb, &stage_loaded[stage], true);
      copy_values(kb, &stage_loaded[stage], true);
    }
    return;  // the copies still in flight complete on the barriers the consumers wait for
  }

  // ---- Consumers ----
  if constexpr (!Tile::kSolo) registers_increase_to<Tile::kConsumerRegisters>();
  const int consumer = Tile::kSolo ? 0 : warpgroup;
  const int warp = static_cast<int>(threadIdx.x) % 128 / 32;  // in the warpgroup
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4;   // fragment row (and row + 8)
  const int t4 = lane % 4;  // fragment column pair
  const std::int64_t q_block = cta_block * Tile::kConsumers + consumer;  // the definition's 64-row block
  const std::int64_t q0 = q_block * kBlockQ;
  const int row0 = warp * kWarpQ + g;  // this thread's rows in the block: row0 and row0 + 8
  // A consumer computes the blocks whose keys its rows see some of, the first ones; the rest it
  // only frees (causal: later consumers' rows see more).
  std::int64_t consumer_key_end = q0 < a.seq_q ? a.seq_kv : 0;
  if (a.causal) consumer_key_end = min(consumer_key_end, min(q0 + kBlockQ, a.seq_q) + a.causal_offset);
  const int computed_blocks =
      consumer_key_end <= 0 ? 0 : min(key_blocks, static_cast<int>((consumer_key_end + kBlockK - 1) / kBlockK));

  // The first key block with keys that some row of the block does not see, past the end or
  // (causal) past a row's diagonal; both grow with kb. Causal: key0 + 127 > q0 + offset, i.e.
  // kb · 128 >= q0 + offset - 126.
  std::int64_t first_masked = a.seq_kv / kBlockK;
  if (a.causal) {
    const std::int64_t first_key = q0 + a.causal_offset - (kBlockK - 2);
    first_masked = min(first_masked, first_key <= 0 ? std::int64_t{0} : (first_key + kBlockK - 1) / kBlockK);
  }
  const int first_masked_block = static_cast<int>(min(first_masked, static_cast<std::int64_t>(key_blocks)));

  // Sage: the scale of this thread's query group (rows row0 and row0 + 8 share it under every
  // granularity). fa3: Q's and K's scales with the softmax scale, one factor for every score.
  float q_scale = 1.0f;
  float score_factor = a.score_scale;
  if constexpr (Tile::kQuantizesQ) {
    __shared__ float warp_amax[4];
    q_scale = q_block_rows.code(a, sq, warp_amax);
    fence_proxy_async_shared();
    __syncthreads();
  } else if constexpr (Tile::kInt8Scores) {
    if (q0 < a.q_rows) {
      std::int64_t group = q_block;
      if (a.granularity == QuantGranularity::per_warp) group = q_block * 4 + warp;
      if (a.granularity == QuantGranularity::per_thread) group = (q_block * 4 + warp) * 8 + g;
      q_scale = a.q_scale[head_q * a.q_groups + group];
    }
  }
  if constexpr (Tile::kFp8Scores) score_factor = a.q_scale[head_q] * a.k_scale[head_kv] * a.score_scale;
  // Sage: the next key block's scale for this thread's columns 2t and 2t + 1 is k_scales[0]
  // (per_thread: k_scales[0] and [1], a group per column parity in each block of 8 groups); a
  // block moves it on by kKScaleStep. Carried through the loop rather than derived from kb,
  // which ptxas would redo in every block.
  const float* k_scales = nullptr;
  constexpr int kKScaleStep = Tile::kPerThreadK ? 8 : 1;
  if constexpr (Tile::kInt8Scores) k_scales = a.k_scale + head_kv * a.k_groups + (Tile::kPerThreadK ? 2 * t4 : 0);
  if constexpr (!Tile::kQuantizesQ) mbarrier_wait(&q_loaded, 0);

  // O's accumulator, m64n{kDim}: acc[4 dt + e] is row row0 + 8 (e / 2), column 8 dt + 2 t4 + e % 2.
  float acc[kDim / 2];
#pragma unroll
  for (int i = 0; i < kDim / 2; ++i) acc[i] = 0.0f;
  float row_max[2] = {-FLT_MAX, -FLT_MAX};  // finite: see the softmax
  float row_sum[2] = {0.0f, 0.0f};  // this thread's share of l; the quad's four add up at the end
  // P of the block whose P·V is still to be issued (in the next turn), as the A operand of each
  // k-step: pa[c] is k16 chunk c (tiles 2c, 2c + 1) for 16-bit P, or k32 chunk c (tiles
  // 4c .. 4c + 3) for e4m3 P. An e4m3 register takes keys 2t, 2t + 1 of two adjacent tiles, so its
  // k order is a permutation of the keys, which the quantizer applied to V's columns as well.
  std::uint32_t pa[Tile::kPvSteps][4];
  // Between blocks: s holds P of the last block, unpacked, and alpha its α; `pending_stage` is its
  // stage. The P·V in flight is of the block before, from stage `in_flight_stage` (-1: none).
  float s[4 * Tile::kScoreTiles];
  float alpha[2] = {1.0f, 1.0f};
  int pending_stage = 0;
  int in_flight_stage = -1;
  // Block sums: the fresh accumulator, and the α of the block it belongs to.
  float block_sum[Tile::kBlockSumPv ? kDim / 2 : 1];
  float block_sum_alpha[2] = {1.0f, 1.0f};
  if constexpr (Tile::kBlockSumPv) {
#pragma unroll
    for (int i = 0; i < kDim / 2; ++i) block_sum[i] = 0.0f;
  }

  // Turns (the overlapped schedule), round the consumers in order: each takes key_blocks + 1 turns,
  // one per key block and one for the last P·V, issues its MMAs in each and passes the turn to the
  // next (named barrier 1 + c is consumer c's turn: its sync and the previous one's arrival).
  // Consumer 0 starts; the last passes nothing after its last turn, so every arrival is waited for.
  const bool last_consumer = consumer == Tile::kConsumers - 1;
  const int my_turn = 1 + consumer;
  const int next_turn = 1 + (consumer + 1) % Tile::kConsumers;
  constexpr int kTurnThreads = 2 * 128;  // a turn's barrier: the warpgroup taking it, the one passing it
  int turns_left = key_blocks + 1;
  auto take_turn = [&] {
    if constexpr (!Tile::kSerial) named_barrier_sync(my_turn, kTurnThreads);
  };
  auto pass_turn = [&] {
    if constexpr (!Tile::kSerial)
      if (--turns_left > 0 || !last_consumer) named_barrier_arrive(next_turn, kTurnThreads);
  };
  if (!Tile::kSerial && last_consumer && key_blocks > 0) named_barrier_arrive(next_turn, kTurnThreads);

  // The MMAs' tiles (descriptor_at): Q, and K's and V's first stage.
  std::uint64_t q_tile = k_major_tile<Tile::kQkRowBytes>(sq);
  std::uint64_t k_tiles = k_major_tile<Tile::kQkRowBytes>(sk0);
  std::uint64_t v_tiles = Tile::kFp8Values ? k_major_tile<Tile::kVRowBytes>(sv0) : n_major_values_tile(sv0);
  // Opaque to the compiler, so that it keeps them rather than folding their arithmetic back into the loop.
  asm volatile("" : "+l"(q_tile), "+l"(k_tiles), "+l"(v_tiles));

  // Issues P·V of the pending block, in a turn after wgmma_fence. fp32+fp16 waits for each
  // 32-key chunk to add it to acc, holding the turn meanwhile.
  auto multiply_p_v = [&] {
    const int v_offset = in_flight_stage * Tile::kSmemV;
    if constexpr (Tile::kChunkedPv) {
      // V was scaled to 2.25 for this, so that a chunk stays inside fp16's range.
#pragma unroll
      for (int c = 0; c < Tile::kPvSteps; ++c) {
        std::uint32_t chunk[kDim / 4];  // half2: row row0 (even registers) or row0 + 8 (odd)
        if (c > 0) wgmma_fence();
        const std::uint64_t v_operand = descriptor_at(v_tiles, v_offset + k_major_offset<kDim, kBlockK>(0, c));
        if constexpr (kDim == 64) wgmma_pv_e4m3_f16acc_n64(chunk, pa[c], v_operand, 0);
        else wgmma_pv_e4m3_f16acc_n128(chunk, pa[c], v_operand, 0);
        wgmma_commit();
        wgmma_wait<0>();
        fence_registers(chunk);
#pragma unroll
        for (int r = 0; r < kDim / 4; ++r) {
          const float2 x = __half22float2(*reinterpret_cast<const __half2*>(&chunk[r]));
          acc[2 * r] += x.x;
          acc[2 * r + 1] += x.y;
        }
      }
    } else {
      auto issue = [&](float(&d)[kDim / 2]) {
#pragma unroll
        for (int c = 0; c < Tile::kPvSteps; ++c) {
          const int accumulate = Tile::kBlockSumPv ? c : 1;
          if constexpr (Tile::kFp8Values) {
            const std::uint64_t v_operand = descriptor_at(v_tiles, v_offset + k_major_offset<kDim, kBlockK>(0, c));
            if constexpr (kDim == 64) wgmma_pv_e4m3_n64(d, pa[c], v_operand, accumulate);
            else wgmma_pv_e4m3_n128(d, pa[c], v_operand, accumulate);
          } else {
            const std::uint64_t v_operand = descriptor_at(v_tiles, v_offset + n_major_values_offset(c));
            if constexpr (std::is_same_v<Elem, __nv_bfloat16> && kDim == 64) wgmma_pv_bf16_n64(d, pa[c], v_operand, accumulate);
            else if constexpr (std::is_same_v<Elem, __nv_bfloat16>) wgmma_pv_bf16_n128(d, pa[c], v_operand, accumulate);
            else if constexpr (kDim == 64) wgmma_pv_f16_n64(d, pa[c], v_operand, accumulate);
            else wgmma_pv_f16_n128(d, pa[c], v_operand, accumulate);
          }
        }
      };
      if constexpr (Tile::kBlockSumPv) issue(block_sum);
      else issue(acc);
      wgmma_commit();
    }
  };
  // Once the P·V in flight is done: its registers are the kernel's again, its stage is free, and
  // a block sum joins acc.
  auto retire_p_v = [&] {
    wgmma_wait<0>();
    if constexpr (Tile::kBlockSumPv) fence_registers(block_sum);
    fence_registers(acc);
    fence_operand_rows(pa);
    if (!Tile::kSolo && in_flight_stage >= 0) mbarrier_arrive(&stage_free[in_flight_stage]);
    if constexpr (Tile::kBlockSumPv) {
#pragma unroll
      for (int i = 0; i < kDim / 2; ++i) acc[i] = acc[i] * block_sum_alpha[(i >> 1) & 1] + block_sum[i];
    }
  };
  // P of the last block, as P·V's A operand.
  auto pack_p = [&] {
    if constexpr (!Tile::kFp8Values) {
#pragma unroll
      for (int c = 0; c < Tile::kPvSteps; ++c) {
        pa[c][0] = pack2<Elem>(s[8 * c + 0], s[8 * c + 1]);
        pa[c][1] = pack2<Elem>(s[8 * c + 2], s[8 * c + 3]);
        pa[c][2] = pack2<Elem>(s[8 * c + 4], s[8 * c + 5]);
        pa[c][3] = pack2<Elem>(s[8 * c + 6], s[8 * c + 7]);
      }
    } else {
#pragma unroll
      for (int c = 0; c < Tile::kPvSteps; ++c)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int lo = 4 * (4 * c + 2 * half), hi = lo + 4;  // the two 8-key tiles of this register pair
          pa[c][2 * half] = pack_e4m3x4(s[lo], s[lo + 1], s[hi], s[hi + 1]);
          pa[c][2 * half + 1] = pack_e4m3x4(s[lo + 2], s[lo + 3], s[hi + 2], s[hi + 3]);
        }
    }
  };
  // acc·α of the pending block (or, with block sums, its α kept for its sum), and its P into pa,
  // ready for its P·V.
  auto stage_p_v = [&] {
    if constexpr (Tile::kBlockSumPv) {
      block_sum_alpha[0] = alpha[0];
      block_sum_alpha[1] = alpha[1];
    } else {
#pragma unroll
      for (int i = 0; i < kDim / 2; ++i) acc[i] *= alpha[(i >> 1) & 1];
    }
    pack_p();
    in_flight_stage = pending_stage;
  };
  // Overlapped schedule: the P·V in flight retired, then the last block staged. This follows the
  // stage's wait loop in the next block, not the softmax: in the softmax's own basic block, ptxas
  // would hoist the wait above it, and the P·V in flight would no longer overlap the softmax.
  auto prepare_p_v = [&] {
    retire_p_v();
    stage_p_v();
  };
  // Serial schedule: P·V of the block just soft-maxed, at once and to its end, so that its
  // registers (the block sum) are free again before the next Q·Kᵀ; three consumers' MMAs
  // interleave instead.
  auto multiply_p_v_now = [&](auto&& before_mma) {
    stage_p_v();
    before_mma();
    wgmma_fence();
    multiply_p_v();
    retire_p_v();
  };

  // Key block kb, with (kWithPv) or without the previous block's P·V in the turn: a compile-time
  // choice, as MMAs issued under a runtime condition are serialized. kMayMask: whether kb may be
  // at or past first_masked_block (else its masking test is left out).
  auto process_block = [&](int kb, auto with_pv, auto may_mask) {
    constexpr bool kWithPv = decltype(with_pv)::value;
    constexpr bool kMayMask = decltype(may_mask)::value;
    const int stage = kb % kStages;
    // Sage: K's scales before the wait for K, so that their load's latency passes under it and
    // under Q·Kᵀ rather than stalling the softmax.
    [[maybe_unused]] float k_scale[2];  // the Sage kinds'
    if constexpr (Tile::kInt8Scores) {
      k_scale[0] = k_scales[0];
      k_scale[1] = Tile::kPerThreadK ? k_scales[1] : k_scale[0];
      k_scales += kKScaleStep;
    }
    mbarrier_wait(&stage_loaded[stage], (kb / kStages) & 1);
    if constexpr (kWithPv) prepare_p_v();
    const std::int64_t key0 = static_cast<std::int64_t>(kb) * kBlockK;

    // ---- In this consumer's turn: S = Q·Kᵀ of this block, then P·V of the last one ----
    auto multiply_q_k = [&](auto& scores) {
      take_turn();
      wgmma_fence();
#pragma unroll
      for (int c = 0; c < Tile::kQkSteps; ++c) {
        const std::uint64_t q_operand =
            descriptor_at(q_tile, k_major_offset<kCtaQ, Tile::kQkRowBytes>(consumer * kBlockQ, c));
        const std::uint64_t k_operand =
            descriptor_at(k_tiles, stage * Tile::kSmemK + k_major_offset<kBlockK, Tile::kQkRowBytes>(0, c));
        if constexpr (Tile::kInt8Scores) wgmma_qk_s8(scores, q_operand, k_operand, c);
        else if constexpr (Tile::kFp8Scores) wgmma_qk_e4m3(scores, q_operand, k_operand, c);
        else if constexpr (std::is_same_v<Elem, __nv_bfloat16>) wgmma_qk_bf16(scores, q_operand, k_operand, c);
        else wgmma_qk_f16(scores, q_operand, k_operand, c);
      }
      wgmma_commit();
      if constexpr (kWithPv) multiply_p_v();
      pass_turn();
      // S is ready once at most the P·V group is still running.
      if constexpr (kWithPv && !Tile::kChunkedPv) wgmma_wait<1>();
      else wgmma_wait<0>();
      fence_registers(scores);
      if constexpr (Tile::kSolo) {
        // Done with K, once all four warps are: its stage takes block kb + kStages, if any (a
        // predicate, not a branch: one instruction fewer a block).
        named_barrier_sync(1, 128);
        load_keys(kb + kStages);
      }
    };
    // Scores stay unscaled until exp2, which takes r·f − m in one FFMA: f is the factor into the
    // log2 domain, by column parity (keys 2t and 2t + 1; the two differ only for per_thread K
    // groups). Rounding is monotonic, so the largest r·f is the largest r times f, or the least r
    // times f where f < 0 (a negative softmax scale; the Sage kinds fold the scale into Q's codes,
    // so their f is never negative).
    float factor[2];
    if constexpr (Tile::kInt8Scores) {
      int si[4 * Tile::kScoreTiles];
      multiply_q_k(si);
      factor[0] = q_scale * k_scale[0];
      factor[1] = Tile::kPerThreadK ? q_scale * k_scale[1] : factor[0];
#pragma unroll
      for (int i = 0; i < 4 * Tile::kScoreTiles; ++i) s[i] = __int2float_rn(si[i]);  // exact: |x| < 2^21
    } else {
      multiply_q_k(s);
      factor[0] = factor[1] = score_factor;
    }
    const bool descending = !Tile::kInt8Scores && score_factor < 0.0f;
    const float hidden_score = descending ? kInf : -kInf;

    // ---- Hidden keys: past the end, or (causal) after the row's diagonal ----
    if (kMayMask && kb >= first_masked_block) {
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
          if (t * 8 + 2 * t4 + (e & 1) >= visible[e >> 1]) s[4 * t + e] = hidden_score;
    }

    // ---- Online softmax (per row: the quad of threads holding it agrees on m) ----
    // Hidden keys' p: exp2(±inf · f + offset) = 0, but ±inf · 0 is NaN, so where f = 0 (a zero
    // softmax scale, or Q or K codes all zero) exp2 takes FLT_MIN instead: a visible key's r times
    // it (below 2^-26 for |r| < 2^100; INT8 and FP8 dot products stay below 2^25) leaves exp2's
    // result at what f = 0 gives.
    float exp_factor[2];
    exp_factor[0] = factor[0] == 0.0f ? FLT_MIN : factor[0];
    exp_factor[1] = !Tile::kPerThreadK ? exp_factor[0] : factor[1] == 0.0f ? FLT_MIN : factor[1];
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      // By column parity and tile parity: four independent chains, from tiles 0 and 1.
      float extreme[2][2] = {{s[2 * rh], s[4 + 2 * rh]}, {s[2 * rh + 1], s[4 + 2 * rh + 1]}};
      if (!descending) {
#pragma unroll
        for (int t = 2; t < Tile::kScoreTiles; ++t)
#pragma unroll
          for (int parity = 0; parity < 2; ++parity)
            extreme[parity][t & 1] = fmaxf(extreme[parity][t & 1], s[4 * t + 2 * rh + parity]);
      } else {
#pragma unroll
        for (int t = 2; t < Tile::kScoreTiles; ++t)
#pragma unroll
          for (int parity = 0; parity < 2; ++parity)
            extreme[parity][t & 1] = fminf(extreme[parity][t & 1], s[4 * t + 2 * rh + parity]);
      }
      float extreme_by_parity[2];
#pragma unroll
      for (int parity = 0; parity < 2; ++parity)
        extreme_by_parity[parity] = descending ? fminf(extreme[parity][0], extreme[parity][1])
                                               : fmaxf(extreme[parity][0], extreme[parity][1]);
      // A parity with every key hidden gives ±inf · f = −inf, or NaN where f = 0, which fmaxf
      // passes over. With one factor for both parities, the extremes combine first.
      float block_max;
      if constexpr (Tile::kPerThreadK) {
        block_max = fmaxf(extreme_by_parity[0] * factor[0], extreme_by_parity[1] * factor[1]);
      } else {
        block_max = (descending ? fminf(extreme_by_parity[0], extreme_by_parity[1])
                                : fmaxf(extreme_by_parity[0], extreme_by_parity[1])) * factor[0];
      }
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 1));
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 2));
      // m starts at -FLT_MAX, not -inf, so that it is finite while every key so far is hidden:
      // exp2 then gives p = 0 for the -inf scores without a branch (and α = 1, acc and l being 0).
      const float m_new = fmaxf(row_max[rh], block_max);
      alpha[rh] = exp2_approx(row_max[rh] - m_new);
      row_max[rh] = m_new;
      const float offset = Tile::kLog2PScale - m_new;  // exp2's argument is r·f + offset
      float sum[2];
#pragma unroll
      for (int t = 0; t < Tile::kScoreTiles; ++t)
#pragma unroll
        for (int parity = 0; parity < 2; ++parity) {
          float& x = s[4 * t + 2 * rh + parity];
          x = exp2_approx(fmaf(x, exp_factor[parity], offset));
          sum[parity] = t == 0 ? x : sum[parity] + x;
        }
      row_sum[rh] = row_sum[rh] * alpha[rh] + (sum[0] + sum[1]);  // l sums p unquantized
    }

    pending_stage = stage;
  };

  if constexpr (Tile::kSerial) {
    auto serial_block = [&](int kb, auto may_mask) {
      // Solo: V's copy waited for before P·V, or once P is packed, after the softmax.
      auto wait_for_values = [&] {
        int parity = (kb / kStages) & 1;
        if constexpr (Tile::kValuesWaitAfterSoftmax) parity = parity_after(parity, row_sum[0], row_sum[1]);
        mbarrier_wait(&values_loaded[kb % kStages], parity);
      };
      process_block(kb, std::false_type{}, may_mask);
      if constexpr (Tile::kSolo && !Tile::kValuesWaitAfterSoftmax) wait_for_values();
      multiply_p_v_now([&] {
        if constexpr (Tile::kValuesWaitAfterSoftmax) wait_for_values();
      });
      if constexpr (Tile::kSolo) {
        named_barrier_sync(1, 128);
        load_values(kb + kStages);
      }
    };
    // The blocks before the first with hidden keys in a loop of their own, without its test
    // (where Tile says).
    const int unmasked_blocks = Tile::kSeparateMaskedLoop ? min(first_masked_block, computed_blocks) : 0;
    int kb = 0;
#pragma unroll 1
    for (; kb < unmasked_blocks; ++kb) serial_block(kb, std::false_type{});
#pragma unroll 1
    for (; kb < computed_blocks; ++kb) serial_block(kb, std::true_type{});
  } else if (computed_blocks > 0) {
    process_block(0, std::false_type{}, std::true_type{});
#pragma unroll 1
    for (int kb = 1; kb < computed_blocks; ++kb) process_block(kb, std::true_type{}, std::true_type{});
    // The last block's P·V, in a turn of its own.
    // (A wait that returns at once, this block's copies having landed: it keeps the basic-block
    // boundary before prepare_p_v that the loop's blocks have.)
    mbarrier_wait(&stage_loaded[pending_stage], ((computed_blocks - 1) / kStages) & 1);
    prepare_p_v();
    take_turn();
    wgmma_fence();
    multiply_p_v();
    pass_turn();
    retire_p_v();
  }
  // Blocks these rows see no key of: freed once loaded (a stage is freed only after its copies
  // have landed), while the turns go round.
#pragma unroll 1
  for (int kb = computed_blocks; kb < key_blocks; ++kb) {
    mbarrier_wait(&stage_loaded[kb % kStages], (kb / kStages) & 1);
    mbarrier_arrive(&stage_free[kb % kStages]);
    take_turn();
    pass_turn();
  }
  if (computed_blocks == 0 && key_blocks > 0) {
    take_turn();
    pass_turn();
  }

  // ---- O = acc · (1 / l) (times V's dequantization), rows with no visible key 0 ----
  // One division per row rather than per element; V's factors are loaded before the row sums'
  // shuffles, so that their latency overlaps them.
  float channel_factor[Tile::kOutTiles][2];  // sage2: V's scale per channel
  float head_factor = 1.0f;                  // fa3: V's scale
  if constexpr (Tile::kKind == QuantizedKind::sage2_int8_fp8) {
#pragma unroll
    for (int dt = 0; dt < Tile::kOutTiles; ++dt) {
      const float2 f = *reinterpret_cast<const float2*>(a.v_scale + head_kv * kDim + dt * 8 + 2 * t4);
      channel_factor[dt][0] = f.x;
      channel_factor[dt][1] = f.y;
    }
  } else if constexpr (Tile::kKind == QuantizedKind::fa3_fp8) {
    head_factor = a.v_scale[head_kv];
  }
#pragma unroll
  for (int rh = 0; rh < 2; ++rh) {
    row_sum[rh] += __shfl_xor_sync(0xffffffffu, row_sum[rh], 1);
    row_sum[rh] += __shfl_xor_sync(0xffffffffu, row_sum[rh], 2);
  }
#pragma unroll
  for (int rh = 0; rh < 2; ++rh) {
    const std::int64_t row = q0 + row0 + rh * 8;
    if (row >= a.seq_q) continue;
    const float inverse_l = row_sum[rh] == 0.0f ? 0.0f : 1.0f / row_sum[rh];  // acc is 0 there too
    // A split of the keys writes fp32 rows and their log-sum-exp, for combine_key_splits.
    const bool split = a.split_out != nullptr;
    if (split && t4 == 0) {
      a.split_lse[head_q * a.seq_q + row] = row_sum[rh] == 0.0f ? -INFINITY : row_max[rh] + log2f(row_sum[rh]);
    }
#pragma unroll
    for (int dt = 0; dt < Tile::kOutTiles; ++dt) {
      if (dt * 8 >= a.out_dim) break;  // V's padding channels (a multiple of 8 of them), not the output's
      float o0 = acc[4 * dt + 2 * rh] * inverse_l;
      float o1 = acc[4 * dt + 2 * rh + 1] * inverse_l;
      if constexpr (Tile::kKind == QuantizedKind::sage2_int8_fp8) {
        o0 *= channel_factor[dt][0];
        o1 *= channel_factor[dt][1];
      } else if constexpr (Tile::kKind == QuantizedKind::fa3_fp8) {
        o0 *= head_factor;
        o1 *= head_factor;
      }
      const std::int64_t at = (head_q * a.seq_q + row) * a.out_dim + dt * 8 + 2 * t4;
      if (split) *reinterpret_cast<float2*>(a.split_out + at) = float2{o0, o1};
      else *reinterpret_cast<std::uint32_t*>(static_cast<Elem*>(a.out) + at) = pack2<Elem>(o0, o1);
    }
  }
}

// Once per instantiation: more than 48 KB of dynamic shared memory must be asked for.
template <class Tile, bool kParts>
void configure_attention_kernel() {
  static const cudaError_t configured = [] {
    const cudaError_t error = cudaFuncSetAttribute(attention_kernel<Tile, kParts>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes);
    if (error != cudaSuccess) {
      (void)cudaGetLastError();  // not left for the next launch's check to report
      return error;
    }
    // All of an SM's shared memory as such, none as L1: solo CTAs share an SM three or four ways.
    const cudaError_t carveout = cudaFuncSetAttribute(attention_kernel<Tile, kParts>,
                                                      cudaFuncAttributePreferredSharedMemoryCarveout,
                                                      cudaSharedmemCarveoutMaxShared);
    if (carveout != cudaSuccess) (void)cudaGetLastError();
    return carveout;
  }();
  ATTNREPLAY_CUDA_CHECK(configured);
}

// One call's parameters: its buffers' TMA descriptors, made on the host.
template <class Tile>
AttentionParams attention_parameters(const AttentionArgs& a) {
  AttentionParams params;
  params.args = a;
  if constexpr (!Tile::kQuantizesQ)
    params.q_map = make_tile_map(a.q, Tile::kQkRowBytes, a.q_rows, std::int64_t{a.batch} * a.heads_q, Tile::kCtaQ, "Q");
  // A split of the keys reads the rows from key_begin on, in the whole buffer's pitches.
  const std::int64_t kb = a.key_begin, heads_kv = std::int64_t{a.batch} * a.heads_kv;
  auto at = [](const void* base, std::int64_t bytes) { return static_cast<const std::uint8_t*>(base) + bytes; };
  params.k_map = make_tile_map(at(a.k, kb * Tile::kQkRowBytes), Tile::kQkRowBytes, a.k_rows - kb, heads_kv, kBlockK,
                               "K", 0, a.k_rows);
  if constexpr (Tile::kFp8Values) {  // (channel, key) rows: the split's columns
    params.v_map = make_tile_map(at(a.v, kb), a.v_length - kb, Tile::kDim, heads_kv, Tile::kDim, "V", a.v_length);
  } else {
    params.v_map = make_tile_map(at(a.v, kb * Tile::kDim * 2), Tile::kDim * 2, a.v_length - kb, heads_kv, kBlockK, "V",
                                 0, a.v_length);
  }
  return params;
}

template <class Tile>
void launch_attention(const AttentionArgs& a, Order order, cudaStream_t stream) {
  configure_attention_kernel<Tile, false>();
  const dim3 grid(static_cast<unsigned>(ceil_div(a.seq_q, Tile::kCtaQ)), static_cast<unsigned>(a.heads_q),
                  static_cast<unsigned>(a.batch));
  launch_kernel("attention_kernel", attention_kernel<Tile, false>, grid, Tile::kThreads, Tile::kSmemBytes, order, stream,
                attention_parameters<Tile>(a));
}

template <class Tile>
void run_job(const KernelJob& job) {
  switch (job.what) {
    case KernelJob::What::launch: return launch_attention<Tile>(*job.args, job.order, job.stream);
    case KernelJob::What::make_parts:
      for (const AttentionArgs& part : *job.parts) job.made->push_back(attention_parameters<Tile>(part));
      return;
    case KernelJob::What::launch_parts: {
      configure_attention_kernel<Tile, true>();
      const dim3 grid(static_cast<unsigned>(ceil_div(job.longest_seq_q, Tile::kCtaQ)),
                      static_cast<unsigned>(job.args->heads_q), static_cast<unsigned>(job.part_count));
      AttentionParams params;  // the calls' own are in device memory
      params.args = *job.args;
      params.parts = job.device_parts;
      return launch_kernel("attention_kernel over several calls", attention_kernel<Tile, true>, grid, Tile::kThreads,
                           Tile::kSmemBytes, job.order, job.stream, params);
    }
  }
}

// Picks the instantiation for the call's head dim, element type and (Sage) K scale granularity.
template <QuantizedKind kKind, PvAccum kPv, bool kPerThreadK>
void dispatch_head_dim(const KernelJob& job) {
  const AttentionArgs& a = *job.args;
  const bool bf16 = a.element == Element::bf16;
  if (a.head_dim == 64 && bf16) return run_job<AttentionTile<kKind, 64, __nv_bfloat16, kPv, kPerThreadK>>(job);
  if (a.head_dim == 64) return run_job<AttentionTile<kKind, 64, __half, kPv, kPerThreadK>>(job);
  if (a.head_dim == 128 && bf16) return run_job<AttentionTile<kKind, 128, __nv_bfloat16, kPv, kPerThreadK>>(job);
  if (a.head_dim == 128) return run_job<AttentionTile<kKind, 128, __half, kPv, kPerThreadK>>(job);
  throw std::invalid_argument("attention kernel: head dim " + std::to_string(a.head_dim) + " (64 or 128 only)");
}

template <QuantizedKind kKind, PvAccum kPv>
void dispatch_attention(const KernelJob& job) {
  if constexpr (kKind == QuantizedKind::sage1_int8 || kKind == QuantizedKind::sage2_int8_fp8) {
    if (job.args->granularity == QuantGranularity::per_thread) return dispatch_head_dim<kKind, kPv, true>(job);
  }
  dispatch_head_dim<kKind, kPv, false>(job);
}

}  // namespace attnreplay::cuda_attention
