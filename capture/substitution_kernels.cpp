// libattncap_kernels.so: attnreplay's kernels (kernels/, registered as in the replay) for kernel
// substitution. The capture part loads it only when ATTNCAP_SUBSTITUTE asks (capture/substitution.h).
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <memory>

#include "capture/substitution.h"
#include "kernels/kernel.h"
#include "formats/call_semantics.h"

namespace attnreplay::capture {
namespace {

class KernelSubstitution final : public Substitution {
 public:
  explicit KernelSubstitution(const Kernel& kernel) : kernel_(kernel) {}
  const std::string& kernel_name() const override { return kernel_.name(); }

  // The checks are the replay's (replay/run/replay_call.cpp), so that a call is substituted
  // exactly where it would be replayed, and never computed as something it is not.
  std::variant<HostTensor, std::string> compute(const AttentionCall& call) override {
    if (const auto refused = unreplayable_arguments(call); !refused.empty()) {
      return fmt::format("the call has {}", fmt::join(refused, ", "));
    }
    if (call.dropout_p > 0) return fmt::format("dropout_p={} (no kernel computes dropout)", call.dropout_p);
    if (const auto missing = missing_extensions(kernel_.description(), call); !missing.empty()) {
      return fmt::format("the call has {}, which the kernel does not compute", fmt::join(missing, " and "));
    }
    if (call.is_ragged() && !kernel_.description().ragged) return "a ragged batch, which the kernel does not take as one";
    if (auto reason = kernel_.unsupported_reason(call)) return *reason;
    try {
      auto prepared = kernel_.prepare(call, options_);
      prepared->run();
      prepared->synchronize();
      return prepared->output();
    } catch (const KernelNotSupported& declined) {
      return std::string(declined.what());
    } catch (const c10::Error& error) {
      return fmt::format("the kernel failed: {}", error.what_without_backtrace());
    } catch (const std::exception& error) {
      return fmt::format("the kernel failed: {}", error.what());
    }
  }

 private:
  const Kernel& kernel_;
  KernelOptions options_;
};

}  // namespace
}  // namespace attnreplay::capture

extern "C" __attribute__((visibility("default"))) attnreplay::capture::Substitution* attncap_open_substitution(
    const char* kernel, std::string* error) {
  using namespace attnreplay;
  const Kernel* found = KernelRegistry::instance().find(kernel);
  if (!found) {
    std::vector<std::string> names;
    for (const auto& known : KernelRegistry::instance().kernels()) names.push_back(known->name());
    *error = fmt::format("no kernel named '{}'; built-in kernels: {}", kernel, fmt::join(names, ", "));
    return nullptr;
  }
  return new capture::KernelSubstitution(*found);
}
