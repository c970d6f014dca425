#pragma once
// A call for a kernel that takes one dense sequence at a time: a ragged or paged call
// (AttentionCall::is_ragged), each sequence a dense call (its keys gathered from their pages); or a
// dense call whose mask is key ranges per sequence (formats/mask_structure.h: padding), each batch
// entry a dense call of the rows and keys its range gives, without a mask. Each part is prepared
// by the kernel; a run runs them all, in order, as a serving loop around such a kernel would, and
// the output is their rows where the call has them, rows of no part 0; a kernel whose prepared
// calls join launches (JoinsLaunches) runs them all in one. Not registered: the runner wraps a
// kernel in it where runs_per_sequence() says.
#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "kernels/kernel.h"

namespace attnreplay {

// Whether `kernel` gets `call` a sequence at a time: a ragged batch it does not take whole, or a
// mask of key ranges given to a kernel that takes diagonals only (KernelDescription::masks).
bool runs_per_sequence(const KernelDescription& kernel, const AttentionCall& call);

// A prepared call whose attention can be launched with others' of the same kernel: attnreplay's
// CUDA kernels, whose one launch then covers a batch's sequences, each prepared on its own.
class JointLaunch {
 public:
  virtual ~JointLaunch() = default;
  virtual void run() = 0;  // queues the attention of every call joined
};
class JoinsLaunches {
 public:
  virtual ~JoinsLaunches() = default;
  // One launch for the attention of `calls` (this among them, all prepared by one kernel).
  virtual std::unique_ptr<JointLaunch> join(const std::vector<PreparedKernel*>& calls) = 0;
};

class ResidentKernel;
struct ModelInputs;

// A padded call (runs_per_sequence, not ragged) on the model's own tensors (kernels/resident_kernel.h):
// each batch entry's rows and keys as views of `inputs` ((b, h, s, d) views), run by `kernel`, the
// output (b, h, s, d) with the rows of no part 0. `call` holds its mask's reading (visibility),
// which gives its ranges; its tensors need only their shapes.
at::Tensor run_resident_per_sequence(const ResidentKernel& kernel, const AttentionCall& call, const ModelInputs& inputs,
                                     const KernelOptions& options);

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
