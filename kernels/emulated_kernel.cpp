#include "kernels/emulated_kernel.h"

#include <fmt/format.h>

namespace attnreplay {
namespace {

class PreparedEmulation final : public PreparedKernel {
 public:
  PreparedEmulation(const AttentionCall& call, QuantizedKind kind, const KernelOptions& options)
      : call_(call), kind_(kind), options_(options.quant), split_keys_(options.split_keys) {
    prepare_inputs();
  }
  // As its CUDA kernel's (kernels/cuda/cuda_attention.cu): quantization, or flash's change of
  // layout, is separate work; flash's reading of bhsd inputs as floats is part of the emulation.
  bool has_preparation() const override {
    return kind_ != QuantizedKind::flash || (call_.layout == Layout::bshd && call_.q.rank() == 4);
  }
  void prepare_inputs() override {
    inputs_ = prepare_attention_inputs(call_, kind_, options_);
    if (!split_keys_) inputs_.key_splits = 1;
  }
  void run() override { output_ = output_in_dtype(run_emulated_attention(inputs_), call_.q.dtype); }
  HostTensor output() override { return output_; }

 private:
  AttentionCall call_;
  QuantizedKind kind_;
  QuantOptions options_;
  bool split_keys_ = true;
  PreparedAttentionInputs inputs_;
  HostTensor output_;
};

}  // namespace

namespace {

KernelDescription emulation_of(const QuantizedKindSpec& spec) {
  KernelDescription description{spec.name + "-cpu",
                                fmt::format("{} ({}) emulated on the CPU (docs/quantized.md)", spec.name, spec.definition),
                                "cpu", false, spec.reduced_precision};
  description.emulation = true;
  // Rows see the keys their structure gives (formats/mask_structure.h), a window's among them; a
  // padded batch comes a batch entry at a time, as to the CUDA kernels, whose outputs these are.
  description.extensions.window = true;
  description.masks = KernelDescription::Masks::diagonals;
  return description;
}

}  // namespace

EmulatedAttentionKernel::EmulatedAttentionKernel(const QuantizedKindSpec& spec)
    : QuantizedAttentionKernel(spec.kind, emulation_of(spec)) {}

std::optional<std::string> EmulatedAttentionKernel::unsupported_reason(const AttentionCall& call) const {
  return quantized_inputs_unsupported_reason(call);
}

std::unique_ptr<PreparedKernel> EmulatedAttentionKernel::prepare(const AttentionCall& call,
                                                                 const KernelOptions& options) const {
  return std::make_unique<PreparedEmulation>(call, kind(), options);
}

namespace {

const bool emulations_registered = [] {
  for (const QuantizedKindSpec& spec : quantized_kinds()) {
    KernelRegistry::instance().add(std::make_unique<EmulatedAttentionKernel>(spec));
  }
  return true;
}();

}  // namespace

}  // namespace attnreplay
