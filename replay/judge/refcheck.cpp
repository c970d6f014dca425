#include "replay/judge/refcheck.h"

#include <fmt/format.h>

namespace attnreplay {

// Defaults sit well outside what a correct kernel's rounding gives at each input precision
// (unit roundoff: bf16 3.9e-3, fp16 4.9e-4, fp32 6e-8) and well inside what a bug gives.
RefcheckLimits refcheck_limits(const RefcheckThresholds& asked, DType dtype) {
  RefcheckLimits t{0.999, 3e-2, asked.max_abs};
  switch (dtype) {
    case DType::float64: t.min_cosine = 1 - 1e-12, t.max_rel_l2 = 1e-10; break;
    case DType::float32: t.min_cosine = 1 - 1e-8, t.max_rel_l2 = 1e-5; break;
    case DType::float16: t.max_rel_l2 = 5e-3; break;
    case DType::bfloat16: t.max_rel_l2 = 3e-2; break;
    default: t.min_cosine = 0.99, t.max_rel_l2 = 0.15; break;  // fp8 inputs, or int8 and fp8 kernels
  }
  if (asked.min_cosine) t.min_cosine = *asked.min_cosine;
  if (asked.max_rel_l2) t.max_rel_l2 = *asked.max_rel_l2;
  return t;
}

void judge(KernelResult& result, const std::optional<RefcheckThresholds>& thresholds, DType dtype) {
  if (!thresholds) {
    result.disposition = Disposition::not_verified;
    return;
  }
  const RefcheckLimits t = refcheck_limits(*thresholds, dtype);
  const ErrorStats& e = *result.error;
  if (e.nan_count > 0) result.refcheck_failures.push_back(fmt::format("{} NaN", e.nan_count));
  if (e.inf_count > 0) result.refcheck_failures.push_back(fmt::format("{} Inf", e.inf_count));
  if (!(e.cosine >= t.min_cosine))
    result.refcheck_failures.push_back(fmt::format("cosine {:.8g} < {:.8g}", e.cosine, t.min_cosine));
  if (!(e.rel_l2 <= t.max_rel_l2))
    result.refcheck_failures.push_back(fmt::format("rel_l2 {:.3g} > {:.3g}", e.rel_l2, t.max_rel_l2));
  if (t.max_abs && !(e.max_abs <= *t.max_abs))
    result.refcheck_failures.push_back(fmt::format("max_abs {:.3g} > {:.3g}", e.max_abs, *t.max_abs));
  result.disposition = result.refcheck_failures.empty() ? Disposition::passed : Disposition::incorrect;
}

}  // namespace attnreplay
