#include "replay/measure/timing_summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace attnreplay {

namespace {

// The median of `values`, reordering them; linear time.
double median_of(std::vector<double>& values) {
  const std::size_t n = values.size();
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(n / 2);
  std::nth_element(values.begin(), middle, values.end());
  if (n % 2) return *middle;
  return 0.5 * (*middle + *std::max_element(values.begin(), middle));
}

// The 1-based ranks that bound the median of n samples with 95 % confidence: the number of
// samples under the true median is Binomial(n, 1/2), so the ranks n/2 -+ 1.96 sqrt(n)/2, widened
// outward to whole ranks. Defined from 6 samples on.
struct MedianRanks {
  std::size_t lower, upper;
};

MedianRanks median_ranks(std::size_t n) {
  const double half = 1.959964 * std::sqrt(static_cast<double>(n)) / 2;
  return {static_cast<std::size_t>(std::max(1.0, std::floor(static_cast<double>(n) / 2 - half))),
          static_cast<std::size_t>(std::min(static_cast<double>(n), std::ceil(static_cast<double>(n) / 2 + half + 1)))};
}

constexpr std::size_t kFewestForInterval = 6;

}  // namespace

double robust_spread(std::vector<double> seconds) {
  if (seconds.size() < 2) return 0;
  const double median = median_of(seconds);
  if (!(median > 0)) return 0;
  for (double& s : seconds) s = std::abs(s - median);
  return 1.4826 * median_of(seconds) / median;
}

double MedianInterval::relative_half_width() const {
  if (!(median > 0)) return std::numeric_limits<double>::infinity();
  return std::max(median - low, high - median) / median;
}

std::optional<MedianInterval> median_interval(std::vector<double> samples) {
  const std::size_t n = samples.size();
  if (n < kFewestForInterval) return std::nullopt;
  const MedianRanks ranks = median_ranks(n);
  MedianInterval interval;
  interval.median = median_of(samples);
  const auto at_rank = [&samples](std::size_t rank) {
    const auto nth = samples.begin() + static_cast<std::ptrdiff_t>(rank - 1);
    std::nth_element(samples.begin(), nth, samples.end());
    return *nth;
  };
  interval.low = at_rank(ranks.lower);
  interval.high = at_rank(ranks.upper);
  return interval;
}

TimingSummary summarize_samples(std::vector<double> seconds) {
  TimingSummary summary;
  summary.samples = static_cast<int>(seconds.size());
  if (seconds.empty()) {
    summary.median_s = summary.min_s = summary.max_s = summary.mean_s = std::numeric_limits<double>::quiet_NaN();
    summary.median_low_s = summary.median_high_s = std::numeric_limits<double>::quiet_NaN();
    return summary;
  }
  std::sort(seconds.begin(), seconds.end());
  const std::size_t n = seconds.size();
  summary.min_s = seconds.front();
  summary.max_s = seconds.back();
  summary.median_s = n % 2 ? seconds[n / 2] : 0.5 * (seconds[n / 2 - 1] + seconds[n / 2]);
  summary.mean_s = std::accumulate(seconds.begin(), seconds.end(), 0.0) / static_cast<double>(n);
  summary.measured_s = summary.mean_s * static_cast<double>(n);
  if (n > 1 && summary.mean_s > 0) {
    double squares = 0;
    for (double s : seconds) squares += (s - summary.mean_s) * (s - summary.mean_s);
    summary.stdev_rel = std::sqrt(squares / static_cast<double>(n - 1)) / summary.mean_s;
  }
  // Sorted already: the interval's ranks are read off, not selected again.
  if (n >= kFewestForInterval) {
    const MedianRanks ranks = median_ranks(n);
    summary.median_low_s = seconds[ranks.lower - 1];
    summary.median_high_s = seconds[ranks.upper - 1];
  } else {
    summary.median_low_s = summary.median_high_s = std::numeric_limits<double>::quiet_NaN();
  }
  summary.spread_rel = robust_spread(std::move(seconds));
  return summary;
}

void summarize_clocks(const ClockReadings& readings, TimingSummary& summary) {
  if (!readings.sm_mhz.empty()) {
    const TimingSummary clocks = summarize_samples(readings.sm_mhz);
    summary.sm_clock_median_mhz = clocks.median_s;
    summary.sm_clock_min_mhz = clocks.min_s;
    summary.sm_clock_max_mhz = clocks.max_s;
    summary.power_capped_fraction = static_cast<double>(readings.power_capped) / static_cast<double>(readings.sm_mhz.size());
  }
  if (!readings.power_w.empty()) summary.power_median_w = summarize_samples(readings.power_w).median_s;
}

std::string untimed_reason(const TimingSummary& summary) {
  // The GPU timers discard a sample taken while the SM clock ran under 75 % of its rated clock
  // (nvbench's throttle guard), and CUPTI's a run it did not record in full.
  const std::string cupti = summary.method == "cupti" ? ", or not recorded in full by CUPTI" : "";
  const std::string clock = summary.sm_clock_median_mhz > 0
                                ? fmt::format("; the driver read a median SM clock of {:.0f} MHz", summary.sm_clock_median_mhz)
                                : std::string();
  return fmt::format("not timed: the {} timer discarded all {} samples it took, each taken while the SM clock ran "
                     "under 75 % of its rated clock{}{}. A throttled GPU gives no time to trust (docs/metrics.md)",
                     summary.method, summary.discarded, cupti, clock);
}

}  // namespace attnreplay
