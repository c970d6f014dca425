// A plug-in kernel whose run() fails inside libtorch's own checks (TORCH_CHECK), as a torch backend
// does on inputs it cannot take: the row's reason must be the message, not libtorch's C++ backtrace.
#include <c10/util/Exception.h>

#include "kernels/kernel.h"

namespace {

class Prepared final : public attnreplay::PreparedKernel {
 public:
  void run() override { TORCH_CHECK(false, "attn_bias: wrong shape (head dimension)"); }
  attnreplay::HostTensor output() override { return {}; }
};

class TorchCheckKernel final : public attnreplay::Kernel {
 public:
  const attnreplay::KernelDescription& description() const override {
    static const attnreplay::KernelDescription d{"cpp-plugin-torch-check", "fails in a TORCH_CHECK", "cpu"};
    return d;
  }
  std::optional<std::string> unsupported_reason(const attnreplay::AttentionCall&) const override {
    return std::nullopt;
  }
  std::unique_ptr<attnreplay::PreparedKernel> prepare(const attnreplay::AttentionCall&, const attnreplay::KernelOptions&) const override {
    return std::make_unique<Prepared>();
  }
};

ATTNREPLAY_REGISTER_KERNEL(TorchCheckKernel);

}  // namespace
