#include "kernels/emulated_kernel.h"

#include <fmt/format.h>

namespace attnreplay {
namespace {

class PreparedEmulation final : public PreparedKernel {
 public:
  PreparedEmulation(const AttentionCall& call, QuantizedKind kind, const QuantOptions& options)
      : call_(call), kind_(kind), options_(options) {
    prepare_inputs();
  }
  bool has_preparation() const override { return true; }
  void prepare_inputs() override { inputs_ = prepare_attention_inputs(call_, kind_, options_); }
  void run() override { output_ = output_in_dtype(run_emulated_attention(inputs_), call_.q.dtype); }
  HostTensor output() override { return output_; }

 private:
  AttentionCall call_;
  QuantizedKind kind_;
  QuantOptions options_;
  PreparedAttentionInputs inputs_;
  HostTensor output_;
};

}  // namespace

std::optional<std::string> EmulatedAttentionKernel::unsupported_reason(const AttentionCall& call) const {
  const DType dtype = call.q.dtype;
  if (dtype != DType::bfloat16 && dtype != DType::float16) {
    return fmt::format("needs bfloat16 or float16 inputs, got {}", dtype_name(dtype));
  }
  if (call.k.dtype != dtype || call.v.dtype != dtype) {
    return fmt::format("needs Q, K and V of one dtype, got {}, {}, {}", dtype_name(dtype), dtype_name(call.k.dtype),
                       dtype_name(call.v.dtype));
  }
  if (call.mask) return "masks other than causal are not supported";
  const AttentionShape s = call.shape();
  if (s.head_dim_qk != s.head_dim_vo) {
    return fmt::format("needs head_dim_qk = head_dim_vo, got {} and {}", s.head_dim_qk, s.head_dim_vo);
  }
  return std::nullopt;
}

std::unique_ptr<PreparedKernel> EmulatedAttentionKernel::prepare(const AttentionCall& call) const {
  return std::make_unique<PreparedEmulation>(call, kind_, quant_options());
}

}  // namespace attnreplay
