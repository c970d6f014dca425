#include "replay/timing.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
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
  if (seconds.empty()) {
    summary.median_s = summary.min_s = summary.max_s = summary.mean_s = std::numeric_limits<double>::quiet_NaN();
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
  summary.spread_rel = robust_spread(std::move(seconds));
  return summary;
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

namespace {

// One kernel's samples, and where the stopping rule stands on them.
class Sampling {
 public:
  explicit Sampling(const StoppingRule& rule) : rule_(rule) {}

  // One sample of runs_per_sample runs (nullopt: discarded by the timer); checks the rule.
  void add(std::optional<double> seconds, int runs_per_sample) {
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
  void time_out() {
    if (reason_.empty()) reason_ = "timeout";
  }
  bool stopped() const { return !reason_.empty(); }
  bool full() const { return full_; }  // no more samples, whatever the others do
  double elapsed_s() const { return elapsed_; }  // of GPU (or CPU) time sampled, all runs counted
  void add_readings(const ClockReadings& more) {
    readings_.sm_mhz.insert(readings_.sm_mhz.end(), more.sm_mhz.begin(), more.sm_mhz.end());
    readings_.power_w.insert(readings_.power_w.end(), more.power_w.begin(), more.power_w.end());
    readings_.power_capped += more.power_capped;
  }

  TimingSummary summary(const SampleTimer& timer) const {
    TimingSummary summary = summarize_samples(samples_);
    summarize_clocks(readings_, summary);
    summary.method = timer.method();
    summary.cache = timer.cache();
    summary.warmup_runs = rule_.warmup_runs;
    summary.discarded = discarded_;
    summary.stop_reason = reason_;
    summary.runs_per_sample = runs_per_sample_;
    summary.measured_s = elapsed_;
    return summary;
  }

 private:
  // The rule's verdict on the samples so far: why to stop, or empty.
  std::string check() {
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

  const StoppingRule& rule_;
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

}  // namespace

TimingSummary measure(PreparedKernel& kernel, SampleTimer& timer, const StoppingRule& rule, ClockMonitor* monitor) {
  const TimedKernel only[] = {{kernel, {}}};
  return measure_interleaved(only, timer, rule, monitor).front();
}

std::vector<TimingSummary> measure_interleaved(std::span<const TimedKernel> kernels, SampleTimer& timer,
                                               const StoppingRule& rule, ClockMonitor* monitor) {
  std::vector<Sampling> samplings(kernels.size(), Sampling(rule));
  const auto all_stopped = [&samplings] {
    return std::all_of(samplings.begin(), samplings.end(), [](const Sampling& s) { return s.stopped(); });
  };
  // A lone kernel takes one turn to the end; several take turns of a tenth of min_time each, so
  // that a clock drifting over the seconds they take moves all of them alike.
  const double turn_s = kernels.size() > 1 ? rule.min_time_s / 10 : std::numeric_limits<double>::infinity();
  const double timeout_s = rule.timeout_s * static_cast<double>(kernels.size());
  const auto start = std::chrono::steady_clock::now();
  bool timed_out = false;
  for (bool first_turn = true; !timed_out && !all_stopped(); first_turn = false) {
    for (std::size_t k = 0; k < kernels.size() && !timed_out; ++k) {
      Sampling& sampling = samplings[k];
      if (sampling.full()) continue;
      PreparedKernel& kernel = kernels[k].kernel;
      try {
        // After the first turn's warm-up, a run before each turn where samples are hot-L2 ones: the
        // other kernels' turns took the L2.
        const int warmup_runs = first_turn ? rule.warmup_runs : timer.cache() == "hot-l2" ? 1 : 0;
        for (int i = 0; i < warmup_runs; ++i) {
          kernel.run();
          kernel.synchronize();
        }
        struct EndKernel {
          SampleTimer& timer;
          ~EndKernel() { timer.end_kernel(); }
        } end_kernel{timer};
        timer.begin_kernel(kernel);
        // Stopped when the turn ends, a throwing sample included; only a finished turn keeps the
        // readings.
        struct StopMonitor {
          ClockMonitor* monitor;
          ~StopMonitor() {
            if (monitor) monitor->stop();
          }
          ClockReadings take() { return std::exchange(monitor, nullptr)->stop(); }
        } stop_monitor{monitor};
        if (monitor) monitor->start();
        const int runs_per_sample = std::max(timer.runs_per_sample(), 1);
        const double turn_ends_at = sampling.elapsed_s() + turn_s;
        std::vector<std::optional<double>> batch;
        std::size_t taken = 0;  // of the batch
        // A turn takes one batch at least, and ends at a batch's end, so that no batch the timer
        // took is wasted.
        do {
          if (taken == batch.size()) {
            batch = timer.time_samples(kernel);
            taken = 0;
            if (batch.empty()) throw std::logic_error(timer.method() + " timer: time_samples gave no sample");
          }
          sampling.add(batch[taken++], runs_per_sample);
          // In any case: a timer that discards every sample (a GPU that always throttles) must not
          // keep the loop going forever.
          if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= timeout_s) {
            timed_out = true;
            break;
          }
          if (sampling.full() || all_stopped()) break;
        } while (taken < batch.size() || sampling.elapsed_s() < turn_ends_at);
        if (monitor) sampling.add_readings(stop_monitor.take());
      } catch (const std::exception& error) {
        if (kernels[k].name.empty()) throw;
        throw std::runtime_error(fmt::format("{}: {}", kernels[k].name, error.what()));
      }
    }
  }
  std::vector<TimingSummary> summaries;
  for (Sampling& sampling : samplings) {
    sampling.time_out();
    summaries.push_back(sampling.summary(timer));
  }
  return summaries;
}

}  // namespace attnreplay
