#include "replay/measure/stopping_rule.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

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

bool noise_settled(const std::vector<double>& noise_history, std::size_t window) {
  if (noise_history.size() < window) return false;
  const auto begin = noise_history.end() - static_cast<std::ptrdiff_t>(window);
  const auto [low, high] = std::minmax_element(begin, noise_history.end());
  const double latest = noise_history.back();
  return latest > 0 && (*high - *low) < 0.05 * latest;
}

void Sampling::add(std::optional<double> seconds, int runs_per_sample) {
  runs_per_sample_ = runs_per_sample;
  if (seconds) {
    samples_.push_back(*seconds);
    elapsed_ += *seconds * runs_per_sample;
  } else {
    ++discarded_;
  }
  if (static_cast<int>(samples_.size()) >= rule_.max_samples) {
    full_ = true;
    if (reason_.empty()) reason_ = "max-samples";
  }
  if (reason_.empty()) reason_ = check();
}

void Sampling::time_out() {
  if (reason_.empty()) reason_ = "timeout";
}

void Sampling::add_readings(const ClockReadings& more) {
  readings_.sm_mhz.insert(readings_.sm_mhz.end(), more.sm_mhz.begin(), more.sm_mhz.end());
  readings_.power_w.insert(readings_.power_w.end(), more.power_w.begin(), more.power_w.end());
  readings_.power_capped += more.power_capped;
}

TimingSummary Sampling::summary(const std::string& method, const std::string& cache) const {
  TimingSummary summary = summarize_samples(samples_);
  summarize_clocks(readings_, summary);
  summary.method = method;
  summary.cache = cache;
  summary.warmup_runs = rule_.warmup_runs;
  summary.discarded = discarded_;
  summary.stop_reason = reason_;
  summary.runs_per_sample = runs_per_sample_;
  summary.measured_s = elapsed_;
  return summary;
}

std::string Sampling::check() {
  if (static_cast<int>(samples_.size()) < std::max(rule_.min_samples, 2) || elapsed_ < rule_.min_time_s) return {};
  // The noise is checked after every sample at first, then after every 1/32 more of them: the
  // checks cost linear time each, and a short kernel may take thousands of samples.
  if (samples_.size() < next_check_) return {};
  next_check_ = samples_.size() + std::max<std::size_t>(1, samples_.size() / 32);
  const double noise = robust_spread(samples_);
  noise_history_.push_back(noise);
  if (noise < rule_.max_noise) return "converged";
  // The median's standard error (1.2533 sigma / sqrt(n) for normal noise) under a tenth of the
  // noise asked for: more samples would not move the median. CUDA events spread a 15 us kernel's
  // samples by 1-2 %, above nvbench's 0.5 %, for all of the 33,000 samples its --min-time takes.
  if (1.2533 * noise / std::sqrt(static_cast<double>(samples_.size())) < 0.1 * rule_.max_noise) {
    return "median-settled";
  }
  if (noise_settled(noise_history_)) return "noise-settled";
  return {};
}

}  // namespace attnreplay
