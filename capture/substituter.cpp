#include "capture/substituter.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "formats/torch_tensor.h"

namespace attnreplay::capture {
namespace {

// This part's folder: libattncap_kernels.so is built into it, for the same torch.
std::filesystem::path own_folder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&own_folder), &info) == 0 || !info.dli_fname) return {};
  return std::filesystem::path(info.dli_fname).parent_path();
}

std::string ranges_text(const CaptureConfig::Ranges& ranges) {
  std::string text;
  for (const auto& [low, high] : ranges) {
    if (!text.empty()) text += ",";
    text += low == high ? std::to_string(low) : fmt::format("{}-{}", low, high);
  }
  return text;
}

// A Python job (its interpreter's symbols are in the process) gets the part with Python kernels.
bool in_python_job() {
  using IsInitialized = int (*)();
  auto is_initialized = reinterpret_cast<IsInitialized>(dlsym(RTLD_DEFAULT, "Py_IsInitialized"));
  return is_initialized && is_initialized();
}

}  // namespace

std::unique_ptr<Substituter> Substituter::open(const CaptureConfig& config) {
  std::filesystem::path part = own_folder() / kKernelsPartFile;
  if (in_python_job() && std::filesystem::exists(own_folder() / kPythonKernelsPartFile)) {
    part = own_folder() / kPythonKernelsPartFile;
  }
  auto off = [&](const std::string& why) {
    std::fprintf(stderr, "[attncap] ATTNCAP_SUBSTITUTE=%s is off, and the job runs unsubstituted: %s\n",
                 config.substitute.c_str(), why.c_str());
    return nullptr;
  };
  if (!std::filesystem::exists(part)) {
    return off(fmt::format("there are no kernels beside this capture part ({}): they are built only for the torch "
                           "attnreplay was built with, and this job's torch is another",
                           own_folder().string()));
  }
  void* handle = dlopen(part.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) return off(fmt::format("cannot load {}: {}", part.string(), dlerror()));
  auto open_substitution = reinterpret_cast<OpenSubstitutionFn>(dlsym(handle, kOpenSubstitutionSymbol));
  if (!open_substitution) return off(fmt::format("{} has no {}", part.string(), kOpenSubstitutionSymbol));
  std::string error;
  std::unique_ptr<Substitution> substitution(open_substitution(config.substitute.c_str(), config.kernel_modules, &error));
  if (!substitution) return off(error);
  if (!config.quiet) {
    std::string where;
    for (const auto& [name, ranges] : {std::pair{"calls", &config.substitute_calls},
                                       std::pair{"layers", &config.substitute_layers},
                                       std::pair{"steps", &config.substitute_steps}}) {
      if (!ranges->empty()) where += fmt::format(", {} {}", name, ranges_text(*ranges));
    }
    std::fprintf(stderr, "[attncap] substituting %s for the attention ops it takes%s\n", config.substitute.c_str(),
                 where.c_str());
  }
  return std::unique_ptr<Substituter>(new Substituter(config, std::move(substitution)));
}

std::optional<std::string> Substituter::declines_early(std::int64_t call_index, std::optional<std::int64_t> layer,
                                                       std::optional<std::int64_t> step, const at::Tensor& query,
                                                       const at::Tensor& key, const at::Tensor& value) const {
  if (!in_ranges(config_.substitute_calls, call_index)) return "outside ATTNCAP_SUBSTITUTE_CALLS";
  if (!config_.substitute_layers.empty() && (!layer || !in_ranges(config_.substitute_layers, *layer))) {
    return "outside ATTNCAP_SUBSTITUTE_LAYERS";
  }
  if (!config_.substitute_steps.empty() && (!step || !in_ranges(config_.substitute_steps, *step))) {
    return "outside ATTNCAP_SUBSTITUTE_STEPS";
  }
  if (c10::GradMode::is_enabled() && (query.requires_grad() || key.requires_grad() || value.requires_grad())) {
    return "its inputs require grad (a kernel's output would carry no gradient)";
  }
  return std::nullopt;
}

std::variant<at::Tensor, std::string> Substituter::compute(const AttentionCall& call, c10::IntArrayRef sizes,
                                                           const at::TensorOptions& options) {
  auto computed = substitution_->compute(call);
  if (auto* reason = std::get_if<std::string>(&computed)) return std::move(*reason);
  return in_op_layout(call, torch_from_host_tensor(std::get<HostTensor>(computed), /*restore_strides=*/false), sizes,
                      options);
}

bool Substituter::takes_resident(const at::Tensor& query) { return substitution_->takes_resident(query.device().type()); }

std::variant<at::Tensor, std::string> Substituter::compute_resident(const AttentionCall& call, const at::Tensor& q,
                                                                    const at::Tensor& k, const at::Tensor& v,
                                                                    const std::optional<at::Tensor>& mask,
                                                                    c10::IntArrayRef sizes,
                                                                    const at::TensorOptions& options) {
  auto computed = substitution_->compute_resident(call, q, k, v, mask);
  if (auto* reason = std::get_if<std::string>(&computed)) return std::move(*reason);
  return in_op_layout(call, std::get<at::Tensor>(std::move(computed)), sizes, options);
}

std::variant<at::Tensor, std::string> Substituter::in_op_layout(const AttentionCall& call, at::Tensor result,
                                                                c10::IntArrayRef sizes,
                                                                const at::TensorOptions& options) {
  // The kernel's (batch, heads, seq, dim) in the op's layout: bshd transposed, thd's rows (batch 1,
  // every sequence's rows in turn) as (rows, heads, dim).
  if (call.layout == Layout::bshd && result.dim() == 4) result = result.transpose(1, 2);
  if (call.layout == Layout::thd && result.dim() == 4) result = result[0].transpose(0, 1);
  // SDPA's 3-dim calls, and paged calls whose dense queries the record holds as rows, differ from
  // the op's output in shape alone.
  if (result.sizes() != sizes && result.numel() == c10::multiply_integers(sizes)) result = result.reshape(sizes);
  if (result.sizes() != sizes) {
    return fmt::format("the kernel's output is {} in the call's layout, not the op's {}",
                       shape_string(result.sizes().vec()), shape_string(sizes.vec()));
  }
  return result.to(options);
}

void Substituter::count(bool substituted, bool resident, const std::string& reason, double seconds, bool queued) {
  std::lock_guard lock(mutex_);
  Tally& tally = substituted ? substituted_ : left_;
  ++tally.calls;
  tally.resident += substituted && resident;
  tally.seconds += seconds;
  tally.queued |= queued;
  if (!substituted) ++left_by_reason_[reason];
}

void Substituter::report() const {
  std::lock_guard lock(mutex_);
  // A GPU op returns once queued: its time here is not its own.
  auto time = [](const Tally& tally) {
    return tally.queued ? std::string("GPU work, not timed here") : fmt::format("{:.3f} s", tally.seconds);
  };
  // Where the kernel ran: on the job's tensors, or on copies through the host (kernels that take
  // host tensors only, ragged batches, ALiBi or sinks), which makes a GPU job's step slower.
  std::string where;
  if (substituted_.calls > 0) {
    where = substituted_.resident == substituted_.calls ? "on the job's own tensors, "
            : substituted_.resident == 0
                ? "through host copies, "
                : fmt::format("{} on the job's own tensors, {} through host copies, ", substituted_.resident,
                              substituted_.calls - substituted_.resident);
  }
  std::string text = fmt::format("[attncap] pid {}: substitution by {}: {} attention calls substituted ({}{}), {} left "
                                 "to the original op ({})",
                                 getpid(), kernel_name(), substituted_.calls, where, time(substituted_), left_.calls,
                                 time(left_));
  for (const auto& [reason, calls] : left_by_reason_) text += fmt::format("\n[attncap]   {} left: {}", calls, reason);
  std::fprintf(stderr, "%s\n", text.c_str());
}

}  // namespace attnreplay::capture
