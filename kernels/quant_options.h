#pragma once
// The quantized kernels' kinds and options (docs/quantized.md), as host and device code both see
// them: C++17, so that nvcc compiles it with the CUDA kernels (kernels/cuda/).
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

}  // namespace attnreplay
