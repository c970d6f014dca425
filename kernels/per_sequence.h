#pragma once
// A ragged or paged call (AttentionCall::is_ragged) for a kernel that takes one dense sequence at a
// time: each sequence becomes a dense call (its keys gathered from their pages), prepared by the
// kernel; a run runs them all, in order, as a serving loop around such a kernel would, and the
// output is their rows in the call's packed order. Not registered: the runner wraps a kernel in it.
#include "kernels/kernel.h"

namespace attnreplay {

class PerSequenceKernel final : public Kernel {
 public:
  explicit PerSequenceKernel(const Kernel& kernel) : kernel_(kernel) {}
  const KernelDescription& description() const override { return kernel_.description(); }
  // The first sequence the kernel declines, named with its index; a kernel that does not
  // compute an extension is refused before (missing_extensions).
  std::optional<std::string> unsupported_reason(const AttentionCall& call) const override;
  std::unique_ptr<PreparedKernel> prepare(const AttentionCall& call, const KernelOptions& options) const override;

 private:
  const Kernel& kernel_;
};

}  // namespace attnreplay
