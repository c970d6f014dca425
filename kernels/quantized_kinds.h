#pragma once
// attnreplay's own attention kernels (docs/quantized.md), one entry per kind: each is registered on
// the GPU (kernels/cuda_attention_kernel.cpp, with the CUDA kernels in kernels/cuda/) and as its
// CPU emulation, "<name>-cpu" (kernels/emulated_kernel.cpp). One entry adds a kind.
#include <optional>
#include <string>
#include <vector>

#include "formats/dtype.h"
#include "kernels/quant_options.h"

namespace attnreplay {

struct QuantizedKindSpec {
  QuantizedKind kind;
  std::string name;        // the GPU kernel's --kernels name; its emulation adds "-cpu"
  std::string definition;  // what it computes, in a few words
  std::string gpu_summary;  // `attnreplay kernels`' line for the GPU kernel
  // The lowest precision it computes in, whose --refcheck defaults judge it (docs/metrics.md).
  std::optional<DType> reduced_precision;
};

const std::vector<QuantizedKindSpec>& quantized_kinds();
const QuantizedKindSpec& quantized_kind(QuantizedKind kind);

}  // namespace attnreplay
