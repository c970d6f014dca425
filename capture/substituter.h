#pragma once
// The capture part's side of kernel substitution (ATTNCAP_SUBSTITUTE): which calls a kernel takes,
// its output as the op's, and the account given at exit. The kernels themselves are in
// libattncap_kernels.so (capture/substitution.h), loaded from beside this part.
#include <ATen/core/Tensor.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>

#include "capture/config.h"
#include "capture/substitution.h"

namespace attnreplay::capture {

class Substituter {
 public:
  // The kernels part beside this part, and the kernel in it; null, having said why on stderr,
  // when either is missing (the job then runs as it would without substitution).
  static std::unique_ptr<Substituter> open(const CaptureConfig& config);

  // Why a call is left to the op before its tensors are read (its place in the run, its inputs);
  // nullopt when the kernel is to be asked.
  std::optional<std::string> declines_early(std::int64_t call_index, std::optional<std::int64_t> layer,
                                            std::optional<std::int64_t> step, const at::Tensor& query,
                                            const at::Tensor& key, const at::Tensor& value) const;
  // The kernel's output for `call` as the op's attention output: in the call's layout (bhsd, bshd,
  // thd rows), of `sizes`, with `options` (device, dtype); or why the kernel does not take it.
  std::variant<at::Tensor, std::string> compute(const AttentionCall& call, c10::IntArrayRef sizes,
                                                const at::TensorOptions& options);
  // Whether a dense call on `query`'s device is computed on the op's own tensors (compute_resident),
  // none of them copied to the host.
  bool takes_resident(const at::Tensor& query);
  // compute's output from the op's q, k, v and mask (in the call's layout) where they are; `call`'s
  // tensors need only their shapes.
  std::variant<at::Tensor, std::string> compute_resident(const AttentionCall& call, const at::Tensor& q,
                                                         const at::Tensor& k, const at::Tensor& v,
                                                         const std::optional<at::Tensor>& mask, c10::IntArrayRef sizes,
                                                         const at::TensorOptions& options);

  // One call's outcome: substituted (`resident`: on the op's own tensors), or left to the op for
  // `reason`; `seconds` from the call's start to its end on the job's thread, which for GPU work
  // only `queued` there is not its time.
  void count(bool substituted, bool resident, const std::string& reason, double seconds, bool queued);
  // "[attncap] substitution by K: N calls substituted ..., M left to the original op: ..."
  void report() const;
  const std::string& kernel_name() const { return substitution_->kernel_name(); }

 private:
  static std::variant<at::Tensor, std::string> in_op_layout(const AttentionCall& call, at::Tensor result,
                                                            c10::IntArrayRef sizes, const at::TensorOptions& options);
  Substituter(const CaptureConfig& config, std::unique_ptr<Substitution> substitution)
      : config_(config), substitution_(std::move(substitution)) {}

  const CaptureConfig& config_;
  std::unique_ptr<Substitution> substitution_;
  mutable std::mutex mutex_;
  struct Tally {
    std::int64_t calls = 0;
    std::int64_t resident = 0;  // substituted calls computed on the op's tensors
    double seconds = 0;
    bool queued = false;  // some of it GPU work that was only queued: no time to give
  };
  Tally substituted_, left_;
  std::map<std::string, std::int64_t> left_by_reason_;
};

}  // namespace attnreplay::capture
