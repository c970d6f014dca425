#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <utility>

#include "formats/errors.h"
#include "kernels/kernel.h"

namespace attnreplay {

std::vector<std::string> missing_extensions(const KernelDescription& kernel, const AttentionCall& call) {
  using Extension = AttentionCall::Extension;
  std::vector<std::string> missing;
  for (const Extension extension : call.extensions()) {
    const Extensions& has = kernel.extensions;
    const bool computed = extension == Extension::window    ? has.window
                          : extension == Extension::softcap ? has.softcap
                          : extension == Extension::alibi   ? has.alibi
                                                            : has.sinks;
    if (!computed) missing.push_back(call.describe(extension));
  }
  return missing;
}

std::optional<std::string> kernel_declines(const Kernel& kernel, const AttentionCall& call) {
  if (const auto missing = missing_extensions(kernel.description(), call); !missing.empty()) {
    return fmt::format("the call has {}, which this kernel does not compute", fmt::join(missing, " and "));
  }
  return kernel.unsupported_reason(call);
}

KernelRegistry& KernelRegistry::instance() {
  static KernelRegistry registry;
  return registry;
}

bool KernelRegistry::add(std::unique_ptr<Kernel> kernel) {
  // A plug-in may reuse a name by mistake, from a static initializer where a throw would end the
  // process: it is refused and the loader reports it. Built-ins never do.
  if (find(kernel->name())) {
    ATTNREPLAY_ASSERT(!loading_source_.empty(), "kernel '" + kernel->name() + "' registered twice");
    rejected_.push_back(fmt::format("{}: kernel '{}' is already registered by {}", loading_source_, kernel->name(),
                                    source_of(kernel->name())));
    return false;
  }
  if (!loading_source_.empty()) sources_[kernel->name()] = loading_source_;
  kernels_.push_back(std::move(kernel));
  // Registration order depends on link order; listing order should not.
  std::sort(kernels_.begin(), kernels_.end(), [](const auto& a, const auto& b) {
    if (a->description().is_reference != b->description().is_reference) return a->description().is_reference;
    return a->name() < b->name();
  });
  return true;
}

const Kernel* KernelRegistry::find(std::string_view name) const {
  for (const auto& kernel : kernels_) {
    if (kernel->name() == name) return kernel.get();
  }
  return nullptr;
}

std::vector<std::string> KernelRegistry::take_rejected() { return std::exchange(rejected_, {}); }

std::string KernelRegistry::source_of(std::string_view name) const {
  const auto found = sources_.find(name);
  return found == sources_.end() ? "built-in" : found->second;
}

KernelRegistry::SourceScope::SourceScope(std::string source)
    : previous_(std::exchange(instance().loading_source_, std::move(source))) {}

KernelRegistry::SourceScope::~SourceScope() { instance().loading_source_ = std::move(previous_); }

}  // namespace attnreplay
