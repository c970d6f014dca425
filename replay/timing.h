#pragma once
// Measurement: run a prepared kernel until a named stopping rule is met. The sample timer is an
// interface so that CUDA-event, CUDA-graph or CUPTI timing replaces the CPU clock without
// touching the stopping logic.
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/kernel.h"

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

struct TimingSummary {
  std::string method;  // "cpu-steady-clock", or a GPU method's label (replay/gpu_timing.h)
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
  double measured_s = 0;  // time spent sampling, warm-up excluded
  std::string stop_reason;  // "converged", "median-settled", "noise-settled", "timeout", "max-samples"
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

// The clocks and power a ClockMonitor read while one kernel's samples ran.
struct ClockReadings {
  std::vector<double> sm_mhz;
  std::vector<double> power_w;
  int power_capped = 0;  // readings taken while the power cap held the clock down
};

// Reads the GPU's clock and power in the background while measure() samples a kernel. The clock
// probe after each sample (the throttle guard's) cannot stand in: the clock recovers within
// microseconds once the load stops, so the probe reads 1.8 GHz where the kernel ran at 1.6.
class ClockMonitor {
 public:
  virtual ~ClockMonitor() = default;
  virtual void start() = 0;
  virtual ClockReadings stop() noexcept = 0;
};

class SampleTimer {
 public:
  virtual ~SampleTimer() = default;
  virtual std::string method() const = 0;
  virtual std::string cache() const = 0;
  // Samples of `kernel`, in the order taken: each the seconds one run took, or nullopt when it must
  // be discarded. One sample, or a batch where a timer queues runs and reads them together (queued
  // CUDA events, CUPTI's records); measure() takes them one by one, and may leave a batch's rest.
  virtual std::vector<std::optional<double>> time_samples(PreparedKernel& kernel) = 0;
  // measure() calls these around the samples of one kernel, after its warm-up: a timer with state
  // per kernel (a CUDA graph of its runs, CUPTI activity) makes it here and drops it at the end,
  // even when a sample throws. begin_kernel() may throw when the kernel cannot be timed this way.
  virtual void begin_kernel(PreparedKernel& /*kernel*/) {}
  virtual void end_kernel() noexcept {}
  // Runs one sample averages over (see TimingSummary): the stopping rule's min_time counts the
  // GPU time spent, which is this many times the sample.
  virtual int runs_per_sample() const { return 1; }
};

class CpuClockTimer final : public SampleTimer {
 public:
  std::string method() const override { return "cpu-steady-clock"; }
  std::string cache() const override { return "n/a"; }
  std::vector<std::optional<double>> time_samples(PreparedKernel& kernel) override;
};

// Pure statistics of a sample set, shared by measure() and its tests.
TimingSummary summarize_samples(std::vector<double> seconds);
// spread_rel alone, in linear time (measure() asks often).
double robust_spread(std::vector<double> seconds);
// The readings' median, min and max clock, median power and capped share, into `summary`.
void summarize_clocks(const ClockReadings& readings, TimingSummary& summary);
// True when the last `window` noise values vary by under 5 % of the latest: more samples would
// not make the estimate better.
bool noise_settled(const std::vector<double>& noise_history, std::size_t window = 16);

// `monitor`, when given, reads the clocks over the samples (after the warm-up).
TimingSummary measure(PreparedKernel& kernel, SampleTimer& timer, const StoppingRule& rule,
                      ClockMonitor* monitor = nullptr);

// One of the kernels measure_interleaved() times; `name`, where given, starts its errors' messages.
struct TimedKernel {
  PreparedKernel& kernel;
  std::string_view name;
};

// measure() for several kernels in turns (each a tenth of the rule's min_time) until each meets the
// rule, so that all see the same clocks: a difference of their medians (a kernel with and without
// its input preparation) does not carry a clock that drifted between them. A kernel whose rule is
// met goes on taking turns until all are done; each summary and its clocks are its own turns'. The
// timeout is the rule's times the number of kernels.
std::vector<TimingSummary> measure_interleaved(std::span<const TimedKernel> kernels, SampleTimer& timer,
                                               const StoppingRule& rule, ClockMonitor* monitor = nullptr);

}  // namespace attnreplay
