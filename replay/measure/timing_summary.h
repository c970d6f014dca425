#pragma once
// What one kernel's timing gives: the statistics of its samples, the clocks they ran at, and why
// it stopped; pure functions over plain values, unit-tested without a GPU.
#include <optional>
#include <string>
#include <vector>

namespace attnreplay {

struct TimingSummary {
  std::string method;  // "cpu-steady-clock", or a GPU method's label (replay/measure/timer_rules.h)
  std::string cache;   // "n/a" for CPU kernels; "cold-l2" or "hot-l2" on the GPU
  int warmup_runs = 0;
  int samples = 0;
  int discarded = 0;  // samples the timer rejected (e.g. taken while the GPU clock throttled)
  // NaN where no sample was kept (untimed(), below): never a time of 0.
  double median_s = 0, min_s = 0, max_s = 0, mean_s = 0;
  double stdev_rel = 0;  // standard deviation / mean
  // 1.4826 * median absolute deviation / median: the relative standard deviation of normal noise,
  // which a few outliers do not move. The stopping rule reads it, and the table's ±% shows it.
  double spread_rel = 0;
  // The median's 95 % confidence interval (median_interval, below); NaN under 6 samples.
  double median_low_s = 0, median_high_s = 0;
  double measured_s = 0;  // time spent sampling, warm-up excluded
  // "precise" (the default rule), "converged", "median-settled", "noise-settled" (stdrel), "budget" (a
  // second kernel past its share), "timeout", "max-samples"
  std::string stop_reason;
  // Runs each sample averages over: 1, or K for CUDA-graph samples (one replay of K runs).
  int runs_per_sample = 1;
  // What the driver reported while the samples ran (replay/nvml_monitor.h); 0 where nothing was
  // read (CPU kernels, no NVML). Under a long matrix-heavy load a board sits at its power limit,
  // well under its rated clock, and time scales with the clock: compare kernels at like clocks.
  double sm_clock_median_mhz = 0, sm_clock_min_mhz = 0, sm_clock_max_mhz = 0;
  double power_median_w = 0;
  double power_capped_fraction = 0;  // of the readings, those with the power cap holding the clock down
  // Sampling ended (at its timeout) with every sample discarded: there is no time to report.
  bool untimed() const { return samples == 0; }
};


// Why a summary has no time, in one line for the report: the timer discarded every sample.
std::string untimed_reason(const TimingSummary& summary);

// The clocks and power a ClockMonitor (replay/measure/measure.h) read while one kernel's samples
// ran.
struct ClockReadings {
  std::vector<double> sm_mhz;
  std::vector<double> power_w;
  int power_capped = 0;  // readings taken while the power cap held the clock down
};


// The 95 % confidence interval of the median of `samples` (any order), from their order
// statistics: the ranks n/2 -+ 1.96 sqrt(n)/2, as the binomial distribution of the samples below the
// true median puts them (docs/metrics.md). Needs no assumption about the samples' distribution.
struct MedianInterval {
  double median = 0, low = 0, high = 0;
  // The interval's larger half over the median: the precision the median is known to.
  double relative_half_width() const;
};
// nullopt for fewer than 6 samples, where the interval would be the whole range or beyond it.
std::optional<MedianInterval> median_interval(std::vector<double> samples);

// Pure statistics of a sample set, shared by measure() and its tests.
TimingSummary summarize_samples(std::vector<double> seconds);
// spread_rel alone, in linear time (measure() asks often).
double robust_spread(std::vector<double> seconds);
// The readings' median, min and max clock, median power and capped share, into `summary`.
void summarize_clocks(const ClockReadings& readings, TimingSummary& summary);

}  // namespace attnreplay
