#include "replay/measure/stopping_rule.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace attnreplay {

namespace {

constexpr std::pair<StoppingCriterion, std::string_view> kCriteria[] = {{StoppingCriterion::precision, "precision"},
                                                                        {StoppingCriterion::stdrel, "stdrel"}};

}  // namespace

std::string_view stopping_criterion_name(StoppingCriterion criterion) {
  for (const auto& [value, name] : kCriteria)
    if (value == criterion) return name;
  return "?";
}

std::optional<StoppingCriterion> parse_stopping_criterion(std::string_view text) {
  for (const auto& [value, name] : kCriteria)
    if (name == text) return value;
  return std::nullopt;
}

const std::vector<std::string>& stopping_criterion_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& entry : kCriteria) out.emplace_back(entry.second);
    return out;
  }();
  return names;
}

std::string StoppingRule::describe() const {
  if (criterion == StoppingCriterion::precision) {
    return fmt::format("precision: warmup {}, >= {} samples and {} s, stop once the median's 95% interval is within "
                       "+-{:.2g}% of it, timeout {} s",
                       warmup_runs, min_samples, min_time_s, precision * 100, timeout_s);
  }
  return fmt::format("stdrel: warmup {}, >= {} samples and {} s, stop at noise < {:.2g}% or settled noise, timeout {} s",
                     warmup_runs, min_samples, min_time_s, max_noise * 100, timeout_s);
}

StoppingRule StoppingRule::gpu_default() {
  StoppingRule rule = gpu_stdrel();
  rule.criterion = StoppingCriterion::precision;
  rule.min_time_s = 0.01;
  rule.precision = 0.005;
  return rule;
}

StoppingRule StoppingRule::cpu_default() {
  StoppingRule rule = cpu_stdrel();
  rule.criterion = StoppingCriterion::precision;
  rule.min_time_s = 0.02;
  rule.precision = 0.05;
  rule.timeout_s = 2;
  return rule;
}

StoppingRule StoppingRule::gpu_stdrel() {
  StoppingRule rule;
  rule.warmup_runs = 3;
  rule.min_samples = 10;
  rule.min_time_s = 0.5;
  rule.max_noise = 0.005;
  rule.precision = 0.005;
  rule.timeout_s = 15.0;
  return rule;
}

StoppingRule StoppingRule::cpu_stdrel() { return StoppingRule{}; }

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

void Sampling::stop(const std::string& reason) {
  full_ = true;
  if (reason_.empty()) reason_ = reason;
}

bool Sampling::past_minimum() const {
  return static_cast<int>(samples_.size()) >= std::max(rule_.min_samples, 2) && elapsed_ >= rule_.min_time_s;
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
  if (!past_minimum()) return {};
  // Checked after every sample at first, then after every 1/32 more of them: the checks cost
  // linear time each, and a short kernel may take thousands of samples.
  if (samples_.size() < next_check_) return {};
  next_check_ = samples_.size() + std::max<std::size_t>(1, samples_.size() / 32);
  return rule_.criterion == StoppingCriterion::precision ? check_precision() : check_stdrel();
}

std::string Sampling::check_precision() {
  const auto interval = median_interval(samples_);
  if (interval && interval->relative_half_width() <= rule_.precision) return "precise";
  return {};
}

std::string Sampling::check_stdrel() {
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
