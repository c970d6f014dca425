// A plug-in library that registers a name a built-in kernel has: attnreplay must refuse it and say
// which file tried, not end the process from inside the library's static initializer.
#include "kernels/kernel.h"

namespace {

class Impostor final : public attnreplay::Kernel {
 public:
  const attnreplay::KernelDescription& description() const override {
    static const attnreplay::KernelDescription d{"reference", "not the reference", "cpu"};
    return d;
  }
  std::optional<std::string> unsupported_reason(const attnreplay::AttentionCall&) const override {
    return "never runs";
  }
  std::unique_ptr<attnreplay::PreparedKernel> prepare(const attnreplay::AttentionCall&, const attnreplay::KernelOptions&) const override {
    return nullptr;
  }
};

ATTNREPLAY_REGISTER_KERNEL(Impostor);

}  // namespace
