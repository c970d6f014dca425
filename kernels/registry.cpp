#include <algorithm>

#include "formats/errors.h"
#include "kernels/kernel.h"

namespace attnreplay {

KernelRegistry& KernelRegistry::instance() {
  static KernelRegistry registry;
  return registry;
}

bool KernelRegistry::add(std::unique_ptr<Kernel> kernel) {
  ATTNREPLAY_ASSERT(!find(kernel->name()), "kernel '" + kernel->name() + "' registered twice");
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

}  // namespace attnreplay
