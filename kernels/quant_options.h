#pragma once
// The quantized kernels' kinds and options (docs/quantized.md), as host and device code both see
// them: C++17, so that nvcc compiles it with the CUDA kernels (kernels/cuda/).
#include <algorithm>
#include <cstdint>

namespace attnreplay {

// attnreplay's own attention kernels, on the GPU and emulated (kernels/quantized_kinds.h).
enum class QuantizedKind { flash, sage1_int8, sage2_int8_fp8, fa3_fp8 };

enum class QuantGranularity { per_block, per_warp, per_thread };  // --quant_gran
enum class PvAccum { fp32, fp32_fp32, fp32_fp16 };                // --pv_accum_dtype
enum class Fp8Scale { per_tensor, per_head };                     // --fp8_scale

struct QuantOptions {
  QuantGranularity quant_gran = QuantGranularity::per_warp;
  bool k_smooth = true;  // --no_k_smooth clears it
  PvAccum pv_accum = PvAccum::fp32_fp32;
  Fp8Scale fp8_scale = Fp8Scale::per_head;
  bool operator==(const QuantOptions& other) const {
    return quant_gran == other.quant_gran && k_smooth == other.k_smooth && pv_accum == other.pv_accum &&
           fp8_scale == other.fp8_scale;
  }
};

// Splits of the keys (docs/quantized.md, "Key splits"): a call of batch 1 without causality whose
// 64-row query blocks times heads would fill under half of kSplitTargetCtas runs its keys in up to
// 64 splits of at least two 128-key blocks each, blocks shared out evenly, enough to reach that
// many CTAs; each split softmaxes its blocks on its own and the splits are combined. A rule of the
// call alone, not of the device, so that the emulation splits as the kernels do: 264 CTAs, two to
// each SM of an H100 or H200. 1: not split.
inline constexpr std::int64_t kSplitTargetCtas = 264;
// Keys in each of `count` splits of seq_kv keys (the last may hold fewer): whole 128-key blocks,
// shared out evenly.
inline std::int64_t key_split_keys(std::int64_t seq_kv, std::int64_t count) {
  const std::int64_t key_blocks = (seq_kv + 127) / 128;
  return (key_blocks + count - 1) / count * 128;
}
inline int key_split_count(std::int64_t batch, std::int64_t heads_q, std::int64_t seq_q, std::int64_t seq_kv,
                           bool causal) {
  if (batch != 1 || causal || seq_q <= 0 || seq_kv <= 0) return 1;
  const std::int64_t ctas = (seq_q + 63) / 64 * heads_q;
  if (2 * ctas >= kSplitTargetCtas) return 1;
  const std::int64_t key_blocks = (seq_kv + 127) / 128;
  const std::int64_t count = std::min({(kSplitTargetCtas + ctas - 1) / ctas, key_blocks / 2, std::int64_t{64}});
  if (count < 2) return 1;
  const std::int64_t keys = key_split_keys(seq_kv, count);
  return static_cast<int>((seq_kv + keys - 1) / keys);  // no split left empty
}

}  // namespace attnreplay
