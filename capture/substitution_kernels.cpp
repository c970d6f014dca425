// The kernels parts of kernel substitution: attnreplay's kernels (kernels/, registered as in the
// replay), and in libattncap_python_kernels.so its Python plug-in host too. The capture part loads
// one only when ATTNCAP_SUBSTITUTE asks (capture/substitution.h).
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>

#include "capture/substitution.h"
#include "formats/call_semantics.h"
#include "formats/mask_structure.h"
#include "formats/mask_structure_torch.h"
#include "formats/torch_tensor.h"
#include "kernels/kernel.h"
#include "kernels/per_sequence.h"
#include "kernels/resident_kernel.h"
#include "kernels/torch_inputs.h"
#ifdef ATTNCAP_PYTHON_KERNELS
#include "kernels/python/python_kernels.h"
#endif

namespace attnreplay::capture {
namespace {

std::string built_in_names() {
  std::vector<std::string> names;
  for (const auto& known : KernelRegistry::instance().kernels()) names.push_back(known->name());
  return fmt::format("{}", fmt::join(names, ", "));
}

class KernelSubstitution final : public Substitution {
 public:
  KernelSubstitution(std::string name, const Kernel* kernel, std::vector<std::string> python_modules)
      : name_(std::move(name)), kernel_(kernel), python_modules_(std::move(python_modules)) {}
  const std::string& kernel_name() const override { return name_; }

  // The checks are the replay's (replay/run/replay_call.cpp), so that a call is substituted
  // exactly where it would be replayed, and never computed as something it is not.
  std::variant<HostTensor, std::string> compute(const AttentionCall& call) override {
    if (auto refused = refusal(call)) return *refused;
    // A ragged or paged batch goes to a kernel that does not take one, and a padded one to a kernel
    // that takes diagonals only, one sequence at a time, as the replay hands it (kernels/per_sequence.h).
    AttentionCall read = call;  // its mask read once for the checks and the kernel
    if (!call.is_ragged() && call.mask) read.visibility = std::make_shared<const CallVisibility>(read_call_visibility(call));
    const PerSequenceKernel per_sequence(*kernel_);
    const Kernel& kernel = runs_per_sequence(kernel_->description(), read) ? per_sequence : *kernel_;
    if (auto reason = kernel_declines(kernel, read)) return *reason;
    return guarded<HostTensor>([&] {
      auto prepared = kernel.prepare(read, options_);
      prepared->run();
      prepared->synchronize();
      return prepared->output();
    });
  }

  bool takes_resident(c10::DeviceType device) override {
#ifdef ATTNCAP_PYTHON_KERNELS
    if (!kernel_ && find_python_kernel()) return false;
#endif
    // On the device its description names: a CUDA kernel on CUDA tensors, a CPU one on CPU tensors.
    return dynamic_cast<const ResidentKernel*>(kernel_) &&
           kernel_->description().device == c10::DeviceTypeName(device, /*lower_case=*/true);
  }

  std::variant<at::Tensor, std::string> compute_resident(const AttentionCall& call, const at::Tensor& q,
                                                         const at::Tensor& k, const at::Tensor& v,
                                                         const std::optional<at::Tensor>& mask) override {
    if (auto refused = refusal(call)) return *refused;
    const ModelInputs inputs{bhsd_view(q, call.layout), bhsd_view(k, call.layout), bhsd_view(v, call.layout), mask};
    const auto& resident = dynamic_cast<const ResidentKernel&>(*kernel_);
    // A padded batch, for a kernel that takes diagonals only: each batch entry cut to its keys, as
    // the replay runs it (kernels/per_sequence.h). The cut needs the mask read.
    std::optional<AttentionCall> read;
    if (mask && kernel_->description().masks == KernelDescription::Masks::diagonals) {
      read = with_mask_read(call, *mask);
      if (runs_per_sequence(kernel_->description(), *read)) {
        if (auto reason = kernel_declines(PerSequenceKernel(*kernel_), *read)) return *reason;
        return guarded<at::Tensor>([&] { return run_resident_per_sequence(resident, *read, inputs, options_); });
      }
    }
    const AttentionCall& checked = read ? *read : call;  // with the mask read, a refusal names what it is
    if (auto reason = kernel_declines(*kernel_, checked)) return *reason;
    return guarded<at::Tensor>([&] { return resident.run_resident(checked, inputs, options_); });
  }

 private:
  // `call` with what its mask was found to be, read where the mask lies (on the GPU, only its rows'
  // ranges come to the host). Reading waits for the job's stream, so a mask is read once for every
  // call that passes the same tensor (transformers passes one to every layer of a step): the tensor
  // is held, so that its memory is no other's meanwhile.
  AttentionCall with_mask_read(const AttentionCall& call, const at::Tensor& mask) {
    std::lock_guard lock(mask_mutex_);
    const bool versioned = !mask.is_inference();
    if (!last_mask_ || !last_mask_->is_same(mask) || (versioned && last_mask_version_ != mask._version()) ||
        last_mask_shape_ != call.shape()) {
      last_mask_ = mask;
      last_mask_version_ = versioned ? mask._version() : 0;
      last_mask_shape_ = call.shape();
      last_mask_reading_ = read_mask_structure_of_tensor(mask, call.shape());
    }
    AttentionCall read = call;
    read.visibility = std::make_shared<const CallVisibility>(call_visibility_with(read, last_mask_reading_));
    return read;
  }

  // Why no kernel computes `call` as the record has it, whichever kernel; nullopt when one may. A
  // Python kernel is looked for here, at its first call.
  std::optional<std::string> refusal(const AttentionCall& call) {
#ifdef ATTNCAP_PYTHON_KERNELS
    if (!kernel_) {
      if (auto missing = find_python_kernel()) return *missing;
    }
#endif
    if (const auto refused = unreplayable_arguments(call); !refused.empty()) {
      return fmt::format("the call has {}", fmt::join(refused, ", "));
    }
    if (call.dropout_p > 0) return fmt::format("dropout_p={} (no kernel computes dropout)", call.dropout_p);
    return std::nullopt;
  }

  // The kernel's work, or the reason it declined or failed, in words.
  template <typename Output, typename Work>
  static std::variant<Output, std::string> guarded(Work&& work) {
    try {
      return work();
    } catch (const KernelNotSupported& declined) {
      return std::string(declined.what());
    } catch (const KernelFailure& failure) {
      return fmt::format("the kernel failed: {}", failure.what());
    } catch (const c10::Error& error) {
      return fmt::format("the kernel failed: {}", error.what_without_backtrace());
    } catch (const std::exception& error) {
      return fmt::format("the kernel failed: {}", error.what());
    }
  }

  // A kernel no built-in has: Python's (the modules given, the library adapters), loaded at the
  // first call, when the job's own `import torch` is long over. Nullopt once found; else why not,
  // said once on stderr and given as every call's reason.
#ifdef ATTNCAP_PYTHON_KERNELS
  std::optional<std::string> find_python_kernel() {
    std::call_once(python_tried_, [this] {
      const PythonKernelsLoaded loaded = load_python_kernels(python_modules_, /*with_adapters=*/true);
      kernel_ = KernelRegistry::instance().find(name_);
      if (!kernel_) {
        std::string why;
        for (const auto& [name, reason] : unavailable_python_kernels()) {
          if (name == name_) why = fmt::format(": {}", reason);
        }
        for (const std::string& error : loaded.errors) why += fmt::format("; {}", error);
        python_error_ = fmt::format("no kernel named '{}'{} (kernels here: {})", name_, why, built_in_names());
      }
      if (!kernel_) std::fprintf(stderr, "[attncap] ATTNCAP_SUBSTITUTE=%s: %s\n", name_.c_str(), python_error_.c_str());
    });
    if (kernel_) return std::nullopt;
    return python_error_;
  }
#endif

  std::string name_;
  const Kernel* kernel_;
  std::vector<std::string> python_modules_;
  std::once_flag python_tried_;
  std::string python_error_;
  KernelOptions options_;
  // The last mask read (with_mask_read).
  std::mutex mask_mutex_;
  std::optional<at::Tensor> last_mask_;
  std::int64_t last_mask_version_ = 0;
  AttentionShape last_mask_shape_;
  std::optional<MaskReading> last_mask_reading_;
};

}  // namespace
}  // namespace attnreplay::capture

extern "C" __attribute__((visibility("default"))) attnreplay::capture::Substitution* attncap_open_substitution(
    const char* kernel, const std::vector<std::string>& python_modules, std::string* error) {
  using namespace attnreplay;
  const Kernel* found = KernelRegistry::instance().find(kernel);
#ifndef ATTNCAP_PYTHON_KERNELS
  if (!found) {
    *error = fmt::format("no kernel named '{}'; built-in kernels: {}{}", kernel, capture::built_in_names(),
                         python_modules.empty() ? "" : " (ATTNCAP_KERNEL_MODULE needs a Python job)");
    return nullptr;
  }
#endif
  // Python kernels are found at the first call: Python cannot import them while this loads.
  return new capture::KernelSubstitution(kernel, found, python_modules);
}
