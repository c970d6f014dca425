#pragma once
// --refcheck: whether a kernel's errors on a call are within thresholds, the asked ones or, for
// the rest, the defaults of the dtype the kernel computes in (docs/metrics.md).
#include <optional>

#include "formats/dtype.h"
#include "replay/results.h"

namespace attnreplay {

struct RefcheckThresholds {
  // Unset fields take the default for the call's dtype (docs/cli.md).
  std::optional<double> min_cosine;
  std::optional<double> max_rel_l2;
  std::optional<double> max_abs;
};

// The thresholds --refcheck applies to one kernel on one call.
struct RefcheckLimits {
  double min_cosine = 0;
  double max_rel_l2 = 0;
  std::optional<double> max_abs;
};
RefcheckLimits refcheck_limits(const RefcheckThresholds& asked, DType dtype);

// Sets `result`'s disposition (passed, incorrect, or not_verified without thresholds) and its
// refcheck_failures from its error statistics, judged in `dtype`.
void judge(KernelResult& result, const std::optional<RefcheckThresholds>& thresholds, DType dtype);

}  // namespace attnreplay
