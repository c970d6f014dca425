#pragma once
// Measurement: run a prepared kernel until its stopping rule is met. The sample timer is an
// interface so that CUDA-event, CUDA-graph, CUPTI or queued timing (replay/measure/timer_*.cpp)
// replaces the CPU clock without touching the stopping logic.
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/kernel.h"
#include "replay/measure/stopping_rule.h"
#include "replay/measure/timing_summary.h"

namespace attnreplay {

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

// `monitor`, when given, reads the clocks over the samples (after the warm-up).
TimingSummary measure(PreparedKernel& kernel, SampleTimer& timer, const StoppingRule& rule,
                      ClockMonitor* monitor = nullptr);

// One of the kernels measure_interleaved() times; `name`, where given, starts its errors' messages.
// `budget`, where above 0, bounds its sampled time, beyond the rule's minimum samples and time, to
// that share of the first kernel's: a second figure (a kernel with its preparation) that must not
// double the cost of the first; it stops with reason "budget" and its interval as it stands.
struct TimedKernel {
  PreparedKernel& kernel;
  std::string_view name;
  double budget = 0;
};

// measure() for several kernels in turns (each a tenth of the rule's min_time, 20 ms at least) until each meets the
// rule, so that all see the same clocks: a difference of their medians (a kernel with and without
// its input preparation) does not carry a clock that drifted between them. A kernel whose rule is
// met goes on taking turns until all are done; each summary and its clocks are its own turns'. The
// timeout is the rule's times the number of kernels.
std::vector<TimingSummary> measure_interleaved(std::span<const TimedKernel> kernels, SampleTimer& timer,
                                               const StoppingRule& rule, ClockMonitor* monitor = nullptr);

// A kernel with an input preparation (PreparedKernel::has_preparation): the kernel alone and the
// whole call as users make it (preparation then kernel), in turns so that both see the same
// clocks, the second figure within half the headline's sampled time (TimedKernel::budget): the
// whole call's when `call_is_headline`, else the kernel's; with `preparation_alone`, the
// preparation by itself after them.
struct PreparedTimings {
  TimingSummary kernel, with_preparation;
  std::optional<TimingSummary> of_preparation;
};
PreparedTimings measure_with_preparation(PreparedKernel& kernel, SampleTimer& timer, const StoppingRule& rule,
                                         ClockMonitor* monitor = nullptr, bool preparation_alone = false,
                                         bool call_is_headline = false);

}  // namespace attnreplay
