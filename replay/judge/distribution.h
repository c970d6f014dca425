#pragma once
// How a figure is spread over many calls: quantiles as numpy computes them, so that a script
// reading the per-call figures from the JSON gets the same numbers.
#include <cstdint>
#include <span>
#include <vector>

namespace attnreplay {

// The `fraction` quantile (0..1) of ascending `sorted` values, interpolated linearly between the
// closest ranks (numpy's default), so that p50 of an even count is the mean of the middle two.
// NaN for no values.
double percentile(std::span<const double> sorted, double fraction);

struct Distribution {
  std::int64_t count = 0;  // values counted (NaN values are left out)
  double min = 0, median = 0, p99 = 0, max = 0;  // NaN when count is 0
};
Distribution distribution_of(std::vector<double> values);

}  // namespace attnreplay
