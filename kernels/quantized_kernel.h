#pragma once
// A registered kernel that implements one kind of docs/quantized.md (kernels/quantized_kinds.h), on
// the GPU or emulated on the CPU: the kind is what the audit's staged emulation and input
// diagnostics follow.
#include "kernels/kernel.h"
#include "kernels/quantized_attention.h"
#include "kernels/quantized_kinds.h"

namespace attnreplay {

class QuantizedAttentionKernel : public Kernel {
 public:
  QuantizedAttentionKernel(QuantizedKind kind, KernelDescription description)
      : kind_(kind), description_(std::move(description)) {}
  const KernelDescription& description() const override { return description_; }
  QuantizedKind kind() const { return kind_; }

 private:
  QuantizedKind kind_;
  KernelDescription description_;
};

}  // namespace attnreplay
