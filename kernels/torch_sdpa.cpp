// torch's scaled_dot_product_attention backends, on the CPU and on CUDA, each called directly so
// that the backend is the one named (SDPA's own dispatcher would silently fall back). Inputs get
// the model's strides back, so a backend sees the memory layout it saw in the model.
#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/util/Exception.h>

#include <functional>

#ifdef ATTNREPLAY_TORCH_CUDA
#include <ATen/native/transformers/cuda/sdp_utils.h>
#endif

#include "formats/errors.h"
#include "formats/torch_tensor.h"
#include "kernels/device_output.h"
#include "kernels/kernel.h"
#include "kernels/resident_kernel.h"
#include "kernels/torch_inputs.h"

namespace attnreplay {
namespace {

struct TorchInputs {
  at::Tensor q, k, v;
  std::optional<at::Tensor> mask;
  bool is_causal = false;
  bool enable_gqa = false;
};

// What a backend takes, made on the device from the model's inputs: bottom-right causality as an
// explicit mask (torch's is_causal is top-left), K/V expanded for GQA when the backend cannot
// broadcast heads, and a bool mask as an additive float one (what SDPA's front door gives every
// backend; the math backend reads a bool mask differently).
// A hidden key costs -inf, except for cuDNN: torch 2.11's front door gives it -65504 (in the
// query's dtype) to work around cuDNN's -inf handling. A row that sees no key then attends to
// every key alike, and that is the output the model got from cuDNN on a left-padded prompt's pads.
// The memory-efficient kernel reads the bias as a full (b, h, s_q, s_kv) tensor whose strides but
// the last are multiples of 8: SDPA's front door pads an unaligned mask's rows (then slices the
// padding off) and expands it, and so does replay. A model's b x 1 x 1 x s_kv padding mask fails
// the backend's own checks otherwise.
at::Tensor efficient_attention_bias(at::Tensor mask, const at::Tensor& q, const at::Tensor& k) {
  constexpr std::int64_t alignment = 8;
  bool aligned = mask.stride(-1) == 1;
  for (std::int64_t d = 0; d + 1 < mask.dim(); ++d) aligned = aligned && mask.stride(d) % alignment == 0;
  if (!aligned) {
    const std::int64_t last = mask.size(-1);
    mask = at::constant_pad_nd(mask, {0, alignment - last % alignment}).slice(-1, 0, last);
  }
  return mask.expand({q.size(0), q.size(1), q.size(2), k.size(2)});
}

struct MaskPreparation {
  bool efficient_bias = false;  // the mask as SDPA's front door gives the memory-efficient kernel
  double hidden_key = -std::numeric_limits<double>::infinity();  // a bool mask's False, as a bias
};

TorchInputs backend_inputs(const ModelInputs& model, const AttentionCall& call, bool expand_gqa,
                           const MaskPreparation& masks) {
  const AttentionShape s = call.shape();
  TorchInputs in{model.q, model.k, model.v, model.mask, call.is_causal, s.is_gqa()};
  if (expand_gqa && s.is_gqa()) {
    in.k = in.k.repeat_interleave(s.heads_q / s.heads_kv, 1);
    in.v = in.v.repeat_interleave(s.heads_q / s.heads_kv, 1);
    in.enable_gqa = false;
  }
  const bool window = call.window_left || call.window_right;
  if (window || (call.is_causal && call.causal_alignment == CausalAlignment::bottom_right && s.seq_q != s.seq_kv)) {
    // The keys each row sees by causality and the window, as a mask.
    const at::Tensor allowed = visible_keys_mask(call, s, at::arange(s.seq_q, model.q.options().dtype(at::kLong)));
    if (in.mask && in.mask->scalar_type() == at::kBool) in.mask = at::logical_and(*in.mask, allowed);
    else if (in.mask) in.mask = in.mask->masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity());
    else in.mask = allowed;
    in.is_causal = false;
  }
  if (in.mask && in.mask->scalar_type() == at::kBool) {
    in.mask = at::zeros(in.mask->sizes(), in.q.options()).masked_fill(in.mask->logical_not(), masks.hidden_key);
  }
  if (in.mask && masks.efficient_bias) in.mask = efficient_attention_bias(*in.mask, in.q, in.k);
  return in;
}

// Whether backend_inputs() does any work for this call (views and unchanged tensors cost nothing).
bool needs_preparation(const AttentionCall& call, bool expand_gqa, const MaskPreparation& masks) {
  const AttentionShape s = call.shape();
  return (expand_gqa && s.is_gqa()) || (call.mask && (call.mask->dtype == DType::boolean || masks.efficient_bias)) ||
         (call.is_causal && call.causal_alignment == CausalAlignment::bottom_right && s.seq_q != s.seq_kv) ||
         call.window_left || call.window_right;
}

bool cuda_available() { return at::detail::getCUDAHooks().hasCUDA(); }

struct TorchBackend {
  std::string name;
  std::string summary;
  std::string device;  // "cpu" or "cuda"
  bool expand_gqa = true;
  std::function<std::optional<std::string>(const AttentionCall&)> unsupported;
  // torch's own verdict on the prepared inputs (CUDA backends), with its reasons.
  std::function<std::optional<std::string>(const TorchInputs&)> torch_check;
  std::function<at::Tensor(const TorchInputs&, double scale)> run;
  MaskPreparation masks;
  bool takes_mask = true;       // a sliding window is replayed as a mask, for backends that take one
};

class TorchSdpaKernel final : public Kernel, public ResidentKernel {
 public:
  explicit TorchSdpaKernel(TorchBackend backend)
      : backend_(std::move(backend)), description_{backend_.name, backend_.summary, backend_.device, false} {
    description_.extensions.window = backend_.takes_mask;
  }
  const KernelDescription& description() const override { return description_; }
  std::optional<std::string> unsupported_reason(const AttentionCall& call) const override {
    if (backend_.device == "cuda" && !cuda_available()) return "no CUDA device";
    return backend_.unsupported(call);
  }

  class Prepared final : public PreparedKernel, public DeviceOutput {
   public:
    Prepared(const TorchBackend& backend, const AttentionCall& call)
        : backend_(backend), call_(call), scale_(call.softmax_scale()),
          has_preparation_(needs_preparation(call, backend.expand_gqa, backend.masks)) {
      const at::Device device = backend.device == "cuda" ? current_gpu() : at::Device(at::kCPU);
      model_ = model_inputs(call, device);
      inputs_ = backend_inputs(model_, call_, backend_.expand_gqa, backend_.masks);
      if (backend.torch_check) {
        if (auto reason = backend.torch_check(inputs_)) throw KernelNotSupported(*reason);
      }
    }
    bool has_preparation() const override { return has_preparation_; }
    void prepare_inputs() override {
      at::InferenceMode inference;
      inputs_ = backend_inputs(model_, call_, backend_.expand_gqa, backend_.masks);
    }
    void run() override {
      at::InferenceMode inference;
      output_ = backend_.run(inputs_, scale_);
    }
    void synchronize() override {
      if (backend_.device == "cuda") at::detail::getCUDAHooks().deviceSynchronize(current_gpu().index());
    }
    // torch's CUDA ops queue on the current stream and allocate through the caching allocator.
    bool runs_on_current_stream() const override { return backend_.device == "cuda"; }
    HostTensor output() override { return host_tensor_from_torch(output_.contiguous()); }
    at::Tensor device_output() override { return output_; }

   private:
    const TorchBackend& backend_;
    AttentionCall call_;
    double scale_;
    bool has_preparation_;
    ModelInputs model_;
    TorchInputs inputs_;
    at::Tensor output_;
  };

  std::unique_ptr<PreparedKernel> prepare(const AttentionCall& call, const KernelOptions&) const override {
    return std::make_unique<Prepared>(backend_, call);
  }

  // Not in inference mode, unlike run(): the job may use the output in ways an inference tensor
  // refuses (an in-place update).
  at::Tensor run_resident(const AttentionCall& call, const ModelInputs& inputs, const KernelOptions&) const override {
    const TorchInputs in = backend_inputs(inputs, call, backend_.expand_gqa, backend_.masks);
    if (backend_.torch_check) {
      if (auto reason = backend_.torch_check(in)) throw KernelNotSupported(*reason);
    }
    return backend_.run(in, call.softmax_scale());
  }

 private:
  TorchBackend backend_;
  KernelDescription description_;
};

std::optional<std::string> needs_dtypes(const AttentionCall& call, std::initializer_list<DType> allowed,
                                        std::string_view who) {
  for (const HostTensor* t : {&call.q, &call.k, &call.v}) {
    if (std::find(allowed.begin(), allowed.end(), t->dtype) == allowed.end()) {
      return fmt::format("dtype {} is not supported by {}", dtype_name(t->dtype), who);
    }
  }
  if (call.q.dtype != call.k.dtype || call.q.dtype != call.v.dtype) return "q, k and v have different dtypes";
  return std::nullopt;
}

at::Tensor run_math(const TorchInputs& in, double scale) {
  return std::get<0>(at::_scaled_dot_product_attention_math(in.q, in.k, in.v, in.mask, 0.0, in.is_causal,
                                                            std::nullopt, scale, in.enable_gqa));
}

TorchBackend math_backend() {
  return {"torch-math", "torch SDPA math backend (aten::_scaled_dot_product_attention_math), CPU", "cpu",
          /*expand_gqa=*/false,
          [](const AttentionCall& call) {
            return needs_dtypes(call, {DType::float64, DType::float32, DType::float16, DType::bfloat16},
                                "torch's CPU attention");
          },
          nullptr, run_math};
}

TorchBackend flash_cpu_backend() {
  return {"torch-flash-cpu", "torch SDPA flash backend for CPU (aten::_scaled_dot_product_flash_attention_for_cpu)",
          "cpu", /*expand_gqa=*/true,
          [](const AttentionCall& call) -> std::optional<std::string> {
            if (auto reason = needs_dtypes(call, {DType::float64, DType::float32, DType::float16, DType::bfloat16},
                                           "torch's CPU attention")) {
              return reason;
            }
            const AttentionShape s = call.shape();
            if (s.head_dim_qk != s.head_dim_vo) {
              return fmt::format("head_dim_qk {} != head_dim_vo {}: the CPU flash kernel needs them equal",
                                 s.head_dim_qk, s.head_dim_vo);
            }
            return std::nullopt;
          },
          [](const TorchInputs& in) -> std::optional<std::string> {
            // The kernel reads rows with unit stride, as SDPA's dispatcher requires of it.
            for (const at::Tensor* t : {&in.q, &in.k, &in.v}) {
              if (t->stride(-1) != 1) return "the CPU flash kernel needs unit stride in the last dim";
            }
            return std::nullopt;
          },
          [](const TorchInputs& in, double scale) {
            return std::get<0>(at::_scaled_dot_product_flash_attention_for_cpu(in.q, in.k, in.v, 0.0, in.is_causal,
                                                                               in.mask, scale));
          }};
}

const bool registered_cpu = [] {
  KernelRegistry::instance().add(std::make_unique<TorchSdpaKernel>(math_backend()));
  KernelRegistry::instance().add(std::make_unique<TorchSdpaKernel>(flash_cpu_backend()));
  return true;
}();

#ifdef ATTNREPLAY_TORCH_CUDA
// Collects the warnings torch's can_use_* checks give in debug mode: they are the reasons.
class WarningCollector final : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  std::vector<std::string> messages;
};

using CanUse = bool (*)(sdp::sdp_params const&, bool);

std::function<std::optional<std::string>(const TorchInputs&)> torch_says(CanUse can_use, std::string backend) {
  return [can_use, backend](const TorchInputs& in) -> std::optional<std::string> {
    WarningCollector collector;
    bool ok = false;
    {
      c10::WarningUtils::WarningHandlerGuard guard(&collector);
      ok = can_use(sdp::sdp_params{in.q, in.k, in.v, in.mask, 0.0, in.is_causal, in.enable_gqa}, /*debug=*/true);
    }
    if (ok) return std::nullopt;
    std::string reason = fmt::format("torch's {} backend declines:", backend);
    for (const std::string& message : collector.messages) reason += " " + message;
    return reason;
  };
}

const auto cuda_dtypes = [](const AttentionCall& call) {
  return needs_dtypes(call, {DType::float32, DType::float16, DType::bfloat16, DType::float64}, "torch's CUDA attention");
};

const bool registered_cuda = [] {
  auto& registry = KernelRegistry::instance();
  registry.add(std::make_unique<TorchSdpaKernel>(TorchBackend{
      "torch-flash", "torch SDPA flash backend, CUDA (aten::_scaled_dot_product_flash_attention, FlashAttention-2)",
      "cuda", true, cuda_dtypes, torch_says(sdp::can_use_flash_attention, "flash"),
      [](const TorchInputs& in, double scale) {
        return std::get<0>(at::_scaled_dot_product_flash_attention(in.q, in.k, in.v, 0.0, in.is_causal, false, scale));
      },
      MaskPreparation{}, /*takes_mask=*/false}));
  registry.add(std::make_unique<TorchSdpaKernel>(TorchBackend{
      "torch-efficient", "torch SDPA memory-efficient backend, CUDA (aten::_scaled_dot_product_efficient_attention)",
      "cuda", true, cuda_dtypes, torch_says(sdp::can_use_mem_efficient_attention, "memory-efficient"),
      [](const TorchInputs& in, double scale) {
        return std::get<0>(
            at::_scaled_dot_product_efficient_attention(in.q, in.k, in.v, in.mask, false, 0.0, in.is_causal, scale));
      },
      MaskPreparation{.efficient_bias = true}}));
  registry.add(std::make_unique<TorchSdpaKernel>(TorchBackend{
      "torch-cudnn", "torch SDPA cuDNN backend, CUDA (aten::_scaled_dot_product_cudnn_attention)", "cuda", true,
      cuda_dtypes, torch_says(sdp::can_use_cudnn_attention, "cuDNN"),
      [](const TorchInputs& in, double scale) {
        return std::get<0>(at::_scaled_dot_product_cudnn_attention(in.q, in.k, in.v, in.mask, false, 0.0, in.is_causal,
                                                                   false, scale));
      },
      MaskPreparation{.hidden_key = -65504.0}}));
  registry.add(std::make_unique<TorchSdpaKernel>(TorchBackend{
      "torch-math-cuda", "torch SDPA math backend on CUDA (aten::_scaled_dot_product_attention_math)", "cuda", false,
      cuda_dtypes, nullptr, run_math}));
  return true;
}();
#endif

}  // namespace
}  // namespace attnreplay
