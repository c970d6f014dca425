// torch's scaled_dot_product_attention backends, each called directly so that the backend is the
// one named (SDPA's own dispatcher would silently fall back). Inputs get the model's strides back,
// so a backend sees the memory layout it saw in the model.
#include <ATen/ATen.h>

#include <functional>

#include "formats/errors.h"
#include "formats/torch_tensor.h"
#include "kernels/kernel.h"

namespace attnreplay {
namespace {

struct TorchInputs {
  at::Tensor q, k, v;
  std::optional<at::Tensor> mask;
  bool is_causal = false;
};

// BHSD views with the model's strides, bottom-right causality turned into an explicit mask (torch's
// is_causal is top-left), and K/V expanded for GQA when the backend cannot broadcast heads.
// SDPA's front door turns a bool mask into an additive float one before any backend sees it; the
// math backend reads a bool mask differently, so it must get the converted one too.
TorchInputs torch_inputs(const AttentionCall& call, bool expand_gqa, bool bool_mask_to_float) {
  const AttentionShape s = call.shape();
  TorchInputs in;
  auto bhsd = [&call](const HostTensor& tensor) {
    at::Tensor t = torch_from_host_tensor(tensor);
    if (t.dim() == 3) t = t.unsqueeze(1);
    return call.layout == Layout::bshd ? t.transpose(1, 2) : t;
  };
  in.q = bhsd(call.q);
  in.k = bhsd(call.k);
  in.v = bhsd(call.v);
  if (expand_gqa && s.is_gqa()) {
    in.k = in.k.repeat_interleave(s.heads_q / s.heads_kv, 1);
    in.v = in.v.repeat_interleave(s.heads_q / s.heads_kv, 1);
  }
  if (call.mask) in.mask = torch_from_host_tensor(*call.mask);
  in.is_causal = call.is_causal;
  if (call.is_causal && call.causal_alignment == CausalAlignment::bottom_right && s.seq_q != s.seq_kv) {
    at::Tensor causal = at::ones({s.seq_q, s.seq_kv}, at::TensorOptions().dtype(at::kBool)).tril(s.seq_kv - s.seq_q);
    if (in.mask && in.mask->scalar_type() == at::kBool) in.mask = at::logical_and(*in.mask, causal);
    else if (in.mask) in.mask = in.mask->masked_fill(causal.logical_not(), -std::numeric_limits<double>::infinity());
    else in.mask = causal;
    in.is_causal = false;
  }
  if (bool_mask_to_float && in.mask && in.mask->scalar_type() == at::kBool) {
    // What SDPA's front door does before calling this backend.
    in.mask = at::zeros(in.mask->sizes(), in.q.options())
                  .masked_fill(in.mask->logical_not(), -std::numeric_limits<double>::infinity());
  }
  return in;
}

struct TorchBackend {
  std::string name;
  std::string summary;
  std::function<std::optional<std::string>(const AttentionCall&)> unsupported;
  std::function<TorchInputs(const AttentionCall&)> prepare;
  std::function<at::Tensor(const TorchInputs&, double scale)> run;
};

class TorchSdpaKernel final : public Kernel {
 public:
  explicit TorchSdpaKernel(TorchBackend backend)
      : backend_(std::move(backend)), description_{backend_.name, backend_.summary, "cpu", false} {}
  const KernelDescription& description() const override { return description_; }
  std::optional<std::string> unsupported_reason(const AttentionCall& call) const override {
    return backend_.unsupported(call);
  }

  class Prepared final : public PreparedKernel {
   public:
    Prepared(const TorchBackend& backend, const AttentionCall& call)
        : backend_(backend), inputs_(backend.prepare(call)), scale_(call.softmax_scale()) {}
    void run() override {
      at::InferenceMode inference;
      output_ = backend_.run(inputs_, scale_);
    }
    HostTensor output() override { return host_tensor_from_torch(output_.contiguous()); }

   private:
    const TorchBackend& backend_;
    TorchInputs inputs_;
    double scale_;
    at::Tensor output_;
  };

  std::unique_ptr<PreparedKernel> prepare(const AttentionCall& call) const override {
    return std::make_unique<Prepared>(backend_, call);
  }

 private:
  TorchBackend backend_;
  KernelDescription description_;
};

std::optional<std::string> needs_torch_float(const AttentionCall& call) {
  for (const HostTensor* t : {&call.q, &call.k, &call.v}) {
    switch (t->dtype) {
      case DType::float64:
      case DType::float32:
      case DType::float16:
      case DType::bfloat16: break;
      default: return fmt::format("dtype {} is not supported by torch's CPU attention", dtype_name(t->dtype));
    }
  }
  if (call.q.dtype != call.k.dtype || call.q.dtype != call.v.dtype) return "q, k and v have different dtypes";
  return std::nullopt;
}

TorchBackend math_backend() {
  return {"torch-math",
          "torch SDPA math backend (aten::_scaled_dot_product_attention_math), CPU",
          needs_torch_float,
          [](const AttentionCall& call) { return torch_inputs(call, /*expand_gqa=*/false, /*bool_mask_to_float=*/true); },
          [](const TorchInputs& in, double scale) {
            return std::get<0>(at::_scaled_dot_product_attention_math(in.q, in.k, in.v, in.mask, 0.0, in.is_causal,
                                                                      std::nullopt, scale, in.q.size(1) != in.k.size(1)));
          }};
}

TorchBackend flash_cpu_backend() {
  return {"torch-flash-cpu",
          "torch SDPA flash backend for CPU (aten::_scaled_dot_product_flash_attention_for_cpu)",
          [](const AttentionCall& call) -> std::optional<std::string> {
            if (auto reason = needs_torch_float(call)) return reason;
            const AttentionShape s = call.shape();
            if (s.head_dim_qk != s.head_dim_vo) {
              return fmt::format("head_dim_qk {} != head_dim_vo {}: the CPU flash kernel needs them equal",
                                 s.head_dim_qk, s.head_dim_vo);
            }
            return std::nullopt;
          },
          [](const AttentionCall& call) {
            TorchInputs in = torch_inputs(call, /*expand_gqa=*/true, /*bool_mask_to_float=*/true);
            // The kernel reads rows with unit stride, as SDPA's dispatcher requires of it.
            for (at::Tensor* t : {&in.q, &in.k, &in.v}) {
              if (t->stride(-1) != 1) *t = t->contiguous();
            }
            return in;
          },
          [](const TorchInputs& in, double scale) {
            return std::get<0>(at::_scaled_dot_product_flash_attention_for_cpu(in.q, in.k, in.v, 0.0, in.is_causal,
                                                                               in.mask, scale));
          }};
}

const bool registered_math = KernelRegistry::instance().add(std::make_unique<TorchSdpaKernel>(math_backend()));
const bool registered_flash_cpu =
    KernelRegistry::instance().add(std::make_unique<TorchSdpaKernel>(flash_cpu_backend()));

}  // namespace
}  // namespace attnreplay
