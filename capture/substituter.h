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

  // One call's outcome: substituted, or left to the op for `reason`; `seconds` from the call's
  // start to its end on the job's thread (GPU ops: to their launch, unless substituted).
  void count(bool substituted, const std::string& reason, double seconds, bool on_gpu);
  // "[attncap] substitution by K: N calls substituted ..., M left to the original op: ..."
  void report() const;
  const std::string& kernel_name() const { return substitution_->kernel_name(); }

 private:
  Substituter(const CaptureConfig& config, std::unique_ptr<Substitution> substitution)
      : config_(config), substitution_(std::move(substitution)) {}

  const CaptureConfig& config_;
  std::unique_ptr<Substitution> substitution_;
  mutable std::mutex mutex_;
  struct Tally {
    std::int64_t calls = 0;
    double seconds = 0;
    bool on_gpu = false;
  };
  Tally substituted_, left_;
  std::map<std::string, std::int64_t> left_by_reason_;
};

}  // namespace attnreplay::capture
