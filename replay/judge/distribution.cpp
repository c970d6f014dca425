#include "replay/judge/distribution.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace attnreplay {

double percentile(std::span<const double> sorted, double fraction) {
  if (sorted.empty()) return std::numeric_limits<double>::quiet_NaN();
  const double rank = std::clamp(fraction, 0.0, 1.0) * static_cast<double>(sorted.size() - 1);
  const auto below = static_cast<std::size_t>(std::floor(rank));
  const std::size_t above = std::min(below + 1, sorted.size() - 1);
  const double weight = rank - static_cast<double>(below);
  // Equal neighbours (infinities among them) give themselves, not inf - inf.
  if (weight == 0 || sorted[below] == sorted[above]) return sorted[below];
  return sorted[below] + weight * (sorted[above] - sorted[below]);
}

Distribution distribution_of(std::vector<double> values) {
  std::erase_if(values, [](double v) { return std::isnan(v); });
  std::sort(values.begin(), values.end());
  Distribution d;
  d.count = static_cast<std::int64_t>(values.size());
  d.min = percentile(values, 0.0);
  d.median = percentile(values, 0.5);
  d.p99 = percentile(values, 0.99);
  d.max = percentile(values, 1.0);
  return d;
}

}  // namespace attnreplay
