#pragma once
// When a kernel's sampling stops: the rule as a named object, and the state of one kernel's
// samples under it.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "replay/measure/timing_summary.h"

namespace attnreplay {

// When sampling stops (--stopping).
enum class StoppingCriterion {
  // The default: once the median is known to within `precision` of itself, a 95 % confidence
  // interval of the median from the samples' order statistics (docs/metrics.md), after at least
  // min_samples and min_time_s. A quiet kernel stops after a few dozen samples, a noisy one later.
  precision,
  // nvbench's "stdrel", on a noise that outliers cannot hold up: sample for at least min_time_s and
  // min_samples, then stop once the samples' robust relative spread (spread_rel) is under
  // max_noise, once the median is known to a tenth of max_noise, or once the spread has settled.
  // A decode-sized kernel's samples carry rare outliers many times its time, which keep the
  // standard deviation from ever settling.
  stdrel,
};
std::string_view stopping_criterion_name(StoppingCriterion criterion);  // "precision", "stdrel"
std::optional<StoppingCriterion> parse_stopping_criterion(std::string_view text);
const std::vector<std::string>& stopping_criterion_names();

// Either criterion, in any case, stops at timeout_s or max_samples.
struct StoppingRule {
  StoppingCriterion criterion = StoppingCriterion::stdrel;
  int warmup_runs = 1;
  int min_samples = 5;
  double min_time_s = 0.1;
  double precision = 0.02;  // precision: the median's 95 % interval within this fraction of it
  double max_noise = 0.02;  // stdrel: relative spread
  double timeout_s = 5.0;
  // A guard, not a rule: nvbench's 0.5 s of GPU time is 33,000 samples of a 15 us kernel.
  int max_samples = 100000;
  std::string describe() const;

  // The defaults: the median to +-0.5 % on the GPU, after 10 samples and 10 ms of them, within
  // 15 s; to +-5 % on the CPU, after 5 samples and 20 ms, within 2 s: a CPU kernel's samples on a
  // shared machine spread by 5-25 % (its threads meet the system's), where a GPU's spread by 0.1-2 %.
  static StoppingRule gpu_default();
  static StoppingRule cpu_default();
  // nvbench's rule (--stopping stdrel): on the GPU >= 10 samples and 0.5 s, 0.5 % noise, 15 s
  // timeout; on the CPU >= 5 samples and 0.1 s, 2 % noise, 5 s.
  static StoppingRule gpu_stdrel();
  static StoppingRule cpu_stdrel();
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
  // Ends the sampling for a reason of the caller's: no more samples.
  void stop(const std::string& reason);
  // Whether the rule's minimum samples and time are taken.
  bool past_minimum() const;
  bool stopped() const { return !reason_.empty(); }
  bool full() const { return full_; }  // no more samples, whatever the others do
  double elapsed_s() const { return elapsed_; }  // of GPU (or CPU) time sampled, all runs counted
  void add_readings(const ClockReadings& more);
  // The samples' statistics, clocks and stop reason, labelled with the timer's method and cache.
  TimingSummary summary(const std::string& method, const std::string& cache) const;

 private:
  // The rule's verdict on the samples so far: why to stop, or empty.
  std::string check();
  std::string check_precision();
  std::string check_stdrel();

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
