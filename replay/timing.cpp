#include "replay/timing.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <utility>

namespace attnreplay {

std::string StoppingRule::describe() const {
  return fmt::format("stdrel: warmup {}, >= {} samples and {} s, stop at noise < {:.2g}% or settled noise, timeout {} s",
                     warmup_runs, min_samples, min_time_s, max_noise * 100, timeout_s);
}

StoppingRule StoppingRule::gpu_default() {
  StoppingRule rule;
  rule.warmup_runs = 3;
  rule.min_samples = 10;
  rule.min_time_s = 0.5;
  rule.max_noise = 0.005;
  rule.timeout_s = 15.0;
  return rule;
}

std::vector<std::optional<double>> CpuClockTimer::time_samples(PreparedKernel& kernel) {
  const auto start = std::chrono::steady_clock::now();
  kernel.run();
  kernel.synchronize();
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

namespace {

// The median of `values`, reordering them; linear time.
double median_of(std::vector<double>& values) {
  const std::size_t n = values.size();
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(n / 2);
  std::nth_element(values.begin(), middle, values.end());
  if (n % 2) return *middle;
  return 0.5 * (*middle + *std::max_element(values.begin(), middle));
}

}  // namespace

double robust_spread(std::vector<double> seconds) {
  if (seconds.size() < 2) return 0;
  const double median = median_of(seconds);
  if (!(median > 0)) return 0;
  for (double& s : seconds) s = std::abs(s - median);
  return 1.4826 * median_of(seconds) / median;
}

TimingSummary summarize_samples(std::vector<double> seconds) {
  TimingSummary summary;
  summary.samples = static_cast<int>(seconds.size());
  if (seconds.empty()) return summary;
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

bool noise_settled(const std::vector<double>& noise_history, std::size_t window) {
  if (noise_history.size() < window) return false;
  const auto begin = noise_history.end() - static_cast<std::ptrdiff_t>(window);
  const auto [low, high] = std::minmax_element(begin, noise_history.end());
  const double latest = noise_history.back();
  return latest > 0 && (*high - *low) < 0.05 * latest;
}

TimingSummary measure(PreparedKernel& kernel, SampleTimer& timer, const StoppingRule& rule, ClockMonitor* monitor) {
  for (int i = 0; i < rule.warmup_runs; ++i) {
    kernel.run();
    kernel.synchronize();
  }
  struct EndKernel {
    SampleTimer& timer;
    ~EndKernel() { timer.end_kernel(); }
  } end_kernel{timer};
  timer.begin_kernel(kernel);
  // Stopped when sampling ends, a throwing sample included; only a finished loop keeps the readings.
  struct StopMonitor {
    ClockMonitor* monitor;
    ~StopMonitor() {
      if (monitor) monitor->stop();
    }
    ClockReadings take() { return std::exchange(monitor, nullptr)->stop(); }
  } stop_monitor{monitor};
  if (monitor) monitor->start();
  const int runs_per_sample = std::max(timer.runs_per_sample(), 1);
  std::vector<double> samples;
  std::vector<double> noise_history;
  int discarded = 0;
  double elapsed = 0;
  std::string reason;
  const auto start = std::chrono::steady_clock::now();
  // The noise is checked after every sample at first, then after every 1/32 more of them: the
  // checks cost linear time each, and a short kernel may take thousands of samples.
  std::size_t next_check = 0;
  std::vector<std::optional<double>> batch;
  std::size_t taken = 0;  // of the batch
  while (true) {
    if (taken == batch.size()) {
      batch = timer.time_samples(kernel);
      taken = 0;
      if (batch.empty()) throw std::logic_error(timer.method() + " timer: time_samples gave no sample");
    }
    if (const std::optional<double> seconds = batch[taken++]) {
      samples.push_back(*seconds);
      elapsed += *seconds * runs_per_sample;
    } else {
      ++discarded;
    }
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // In any case: a timer that discards every sample (a GPU that always throttles) must not
    // keep the loop going forever.
    if (wall >= rule.timeout_s) {
      reason = "timeout";
      break;
    }
    if (static_cast<int>(samples.size()) >= rule.max_samples) {
      reason = "max-samples";
      break;
    }
    if (static_cast<int>(samples.size()) < std::max(rule.min_samples, 2) || elapsed < rule.min_time_s) continue;
    if (samples.size() < next_check) continue;
    next_check = samples.size() + std::max<std::size_t>(1, samples.size() / 32);
    const double noise = robust_spread(samples);
    noise_history.push_back(noise);
    if (noise < rule.max_noise) {
      reason = "converged";
      break;
    }
    // The median's standard error (1.2533 sigma / sqrt(n) for normal noise) under a tenth of the
    // noise asked for: more samples would not move the median. CUDA events spread a 15 us kernel's
    // samples by 1-2 %, above nvbench's 0.5 %, for all of the 33,000 samples its --min-time takes.
    if (1.2533 * noise / std::sqrt(static_cast<double>(samples.size())) < 0.1 * rule.max_noise) {
      reason = "median-settled";
      break;
    }
    if (noise_settled(noise_history)) {
      reason = "noise-settled";
      break;
    }
  }
  const ClockReadings readings = monitor ? stop_monitor.take() : ClockReadings{};
  TimingSummary summary = summarize_samples(samples);
  summarize_clocks(readings, summary);
  summary.method = timer.method();
  summary.cache = timer.cache();
  summary.warmup_runs = rule.warmup_runs;
  summary.discarded = discarded;
  summary.stop_reason = reason;
  summary.runs_per_sample = runs_per_sample;
  summary.measured_s *= runs_per_sample;
  return summary;
}

}  // namespace attnreplay
