// torch's FlashAttention-2 over a whole ragged batch in one launch (aten::_flash_attention_forward
// with cumulative sequence offsets), as flash-attn's varlen op runs it; a paged call's keys are
// gathered from their pages first, timed as the kernel's input preparation. CUDA only.
#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <fmt/format.h>

#include "formats/torch_tensor.h"
#include "kernels/device_output.h"
#include "kernels/kernel.h"
#include "kernels/torch_inputs.h"

namespace attnreplay {
namespace {

class PreparedVarlen final : public PreparedKernel, public DeviceOutput {
 public:
  explicit PreparedVarlen(const AttentionCall& call)
      : causal_(call.is_causal), scale_(call.softmax_scale()) {
    at::InferenceMode inference;
    const at::Device gpu = current_gpu();
    for (const auto& sequence : call.sequences()) {
      max_q_ = std::max(max_q_, sequence.q_len);
      max_k_ = std::max(max_k_, sequence.k_len);
    }
    q_ = device_copy(call.q, gpu);
    cu_q_ = device_copy(*call.cu_seqlens_q, gpu).to(at::kInt);
    if (call.is_paged()) {
      PackedKeyRows keys = packed_key_rows(call, gpu);
      pages_k_ = device_copy(call.k, gpu).flatten(0, 1);
      pages_v_ = device_copy(call.v, gpu).flatten(0, 1);
      gather_ = std::move(keys.rows);
      cu_k_ = std::move(keys.cu_seqlens_k);
      prepare_inputs();
    } else {
      k_ = device_copy(call.k, gpu);
      v_ = device_copy(call.v, gpu);
      cu_k_ = device_copy(*call.cu_seqlens_k, gpu).to(at::kInt);
      if (call.seqused_k) seqused_k_ = device_copy(*call.seqused_k, gpu).to(at::kInt);
    }
    if (call.alibi_slopes) alibi_ = device_copy(*call.alibi_slopes, gpu).to(at::kFloat);
    if (call.window_left) window_left_ = *call.window_left;
    if (call.window_right) window_right_ = *call.window_right;
  }
  bool has_preparation() const override { return pages_k_.defined(); }
  void prepare_inputs() override {
    if (!pages_k_.defined()) return;
    at::InferenceMode inference;
    k_ = pages_k_.index_select(0, gather_);
    v_ = pages_v_.index_select(0, gather_);
  }
  void run() override {
    at::InferenceMode inference;
    out_ = std::get<0>(at::_flash_attention_forward(q_, k_, v_, cu_q_, cu_k_, max_q_, max_k_, 0.0, causal_, false,
                                                    scale_, window_left_, window_right_, seqused_k_, alibi_));
  }
  void synchronize() override { at::detail::getCUDAHooks().deviceSynchronize(current_gpu().index()); }
  bool runs_on_current_stream() const override { return true; }
  HostTensor output() override { return host_tensor_from_torch(device_output().contiguous()); }
  at::Tensor device_output() override { return out_.transpose(0, 1).unsqueeze(0); }  // (1, h, t, d)

 private:
  bool causal_;
  double scale_;
  std::int64_t max_q_ = 0, max_k_ = 0;
  at::Tensor q_, k_, v_, cu_q_, cu_k_, pages_k_, pages_v_, gather_, out_;
  std::optional<at::Tensor> seqused_k_, alibi_;
  std::optional<std::int64_t> window_left_, window_right_;
};

class TorchFlashVarlen final : public Kernel {
 public:
  const KernelDescription& description() const override {
    static const KernelDescription d = [] {
      KernelDescription k{"torch-flash-varlen",
                          "torch's FlashAttention-2 over a ragged or paged batch in one launch "
                          "(aten::_flash_attention_forward with cum_seq_q/k), CUDA",
                          "cuda"};
      k.extensions.window = k.extensions.alibi = true;
      k.ragged = k.paged = true;
      return k;
    }();
    return d;
  }
  std::optional<std::string> unsupported_reason(const AttentionCall& call) const override {
    if (!at::detail::getCUDAHooks().hasCUDA()) return "no CUDA device";
    if (!call.is_ragged()) return "takes ragged (thd) calls; torch-flash runs dense ones";
    for (const HostTensor* t : {&call.q, &call.k, &call.v}) {
      if (t->dtype != DType::float16 && t->dtype != DType::bfloat16) {
        return fmt::format("dtype {}: FlashAttention-2 takes float16 and bfloat16", dtype_name(t->dtype));
      }
    }
    const AttentionShape s = call.shape();
    if (s.head_dim_qk != s.head_dim_vo || s.head_dim_qk % 8 != 0 || s.head_dim_qk > 256) {
      return fmt::format("head dims {} and {}: FlashAttention-2 takes one head dim, a multiple of 8 up to 256",
                         s.head_dim_qk, s.head_dim_vo);
    }
    if ((call.is_causal || call.window_left || call.window_right) && call.causal_alignment != CausalAlignment::bottom_right) {
      return "FlashAttention-2 aligns causality and windows bottom-right; the call is top-left";
    }
    return std::nullopt;
  }
  std::unique_ptr<PreparedKernel> prepare(const AttentionCall& call, const KernelOptions&) const override {
    return std::make_unique<PreparedVarlen>(call);
  }
};

ATTNREPLAY_REGISTER_KERNEL(TorchFlashVarlen);

}  // namespace
}  // namespace attnreplay
