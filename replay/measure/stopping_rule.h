#pragma once
// When a kernel's sampling stops: the rule as a named object, and the state of one kernel's
// samples under it.
#include <optional>
#include <string>
#include <vector>

#include "replay/measure/timing_summary.h"

namespace attnreplay {

// nvbench's "stdrel" criterion, on a noise that outliers cannot hold up: sample for at least
// min_time_s and min_samples, then stop once the samples' robust relative spread (spread_rel) is
// under max_noise, once the median is known to a tenth of max_noise, or once the spread has
// settled, and in any case at timeout_s or max_samples. A
// decode-sized kernel's samples carry rare outliers many times its time, which keep the standard
// deviation from ever settling. CPU defaults are shorter than nvbench's GPU ones.
struct StoppingRule {
  int warmup_runs = 1;
  int min_samples = 5;
  double min_time_s = 0.1;
  double max_noise = 0.02;  // relative standard deviation
  double timeout_s = 5.0;
  // A guard, not a rule: nvbench's 0.5 s of GPU time is 33,000 samples of a 15 us kernel.
  int max_samples = 100000;
  std::string describe() const;
  // nvbench's defaults for GPU kernels: >= 10 samples and 0.5 s, 0.5 % noise, 15 s timeout.
  static StoppingRule gpu_default();
};

// True when the last `window` noise values vary by under 5 % of the latest: more samples would
// not make the estimate better.
bool noise_settled(const std::vector<double>& noise_history, std::size_t window = 16);

// One kernel's samples, and where the stopping rule stands on them.
class Sampling {
 public:
  explicit Sampling(const StoppingRule& rule) : rule_(rule) {}

  // One sample of runs_per_sample runs (nullopt: discarded by the timer); checks the rule.
  void add(std::optional<double> seconds, int runs_per_sample);
  void time_out();
  bool stopped() const { return !reason_.empty(); }
  bool full() const { return full_; }  // no more samples, whatever the others do
  double elapsed_s() const { return elapsed_; }  // of GPU (or CPU) time sampled, all runs counted
  void add_readings(const ClockReadings& more);
  // The samples' statistics, clocks and stop reason, labelled with the timer's method and cache.
  TimingSummary summary(const std::string& method, const std::string& cache) const;

 private:
  // The rule's verdict on the samples so far: why to stop, or empty.
  std::string check();

  StoppingRule rule_;
  std::vector<double> samples_;
  std::vector<double> noise_history_;
  std::size_t next_check_ = 0;
  int discarded_ = 0;
  int runs_per_sample_ = 1;
  double elapsed_ = 0;
  bool full_ = false;
  std::string reason_;
  ClockReadings readings_;
};

}  // namespace attnreplay
