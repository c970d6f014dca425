#include "replay/measure/measure.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <stdexcept>
#include <utility>

namespace attnreplay {

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
  // (At least 20 ms where there is a min_time: each turn starts and stops the clock monitor.)
  const double turn_s = kernels.size() < 2         ? std::numeric_limits<double>::infinity()
                        : rule.min_time_s > 0 ? std::max(rule.min_time_s / 10, 0.02)
                                              : 0.0;
  const double timeout_s = rule.timeout_s * static_cast<double>(kernels.size());
  // The first kernel's sampled time when its rule was met: the measure of the others' budgets,
  // which its further turns (beside theirs) do not grow.
  std::optional<double> first_stopped_at;
  const auto over_budget = [&](std::size_t k) {
    if (k == 0 && !first_stopped_at && samplings[0].stopped()) first_stopped_at = samplings[0].elapsed_s();
    if (k == 0 || kernels[k].budget <= 0 || !samplings[k].past_minimum()) return false;
    return samplings[k].elapsed_s() >= kernels[k].budget * first_stopped_at.value_or(samplings[0].elapsed_s());
  };
  const auto start = std::chrono::steady_clock::now();
  bool timed_out = false;
  for (bool first_turn = true; !timed_out && !all_stopped(); first_turn = false) {
    for (std::size_t k = 0; k < kernels.size() && !timed_out; ++k) {
      Sampling& sampling = samplings[k];
      if (sampling.full()) continue;
      if (over_budget(k)) {
        // Until the first kernel's rule is met its budget grows; then this one is done.
        if (first_stopped_at) sampling.stop("budget");
        continue;
      }
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
          if (sampling.full() || all_stopped() || over_budget(k)) break;
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
    summaries.push_back(sampling.summary(timer.method(), timer.cache()));
  }
  return summaries;
}

namespace {

// A kernel's input preparation as a run of its own, followed by the kernel or alone.
class PreparationRun final : public PreparedKernel {
 public:
  PreparationRun(PreparedKernel& kernel, bool with_kernel) : kernel_(kernel), with_kernel_(with_kernel) {}
  void run() override {
    kernel_.prepare_inputs();
    if (with_kernel_) kernel_.run();
  }
  void synchronize() override { kernel_.synchronize(); }
  HostTensor output() override { return kernel_.output(); }
  bool runs_on_current_stream() const override { return kernel_.runs_on_current_stream(); }

 private:
  PreparedKernel& kernel_;
  bool with_kernel_;
};

}  // namespace

PreparedTimings measure_with_preparation(PreparedKernel& kernel, SampleTimer& timer, const StoppingRule& rule,
                                         ClockMonitor* monitor, bool preparation_alone, bool call_is_headline) {
  // The kernel and the whole call in turns, so that the two see the same clocks; the preparation
  // alone, where asked, after them: in their turns its low power left the kernel's next turn at a
  // higher clock under a power cap (docs/metrics.md). Alone, it is its own figure: the whole
  // call's median less the kernel's is lost in their noise on long calls.
  PreparationRun with_preparation(kernel, true), alone(kernel, false);
  // The headline first, with the rule's full precision; the other figure within its budget.
  const TimedKernel kernel_alone{kernel, call_is_headline ? "timing the kernel alone" : "", call_is_headline ? 0.5 : 0};
  const TimedKernel whole_call{with_preparation, call_is_headline ? "" : "timing with its input preparation",
                               call_is_headline ? 0 : 0.5};
  const TimedKernel pair[] = {call_is_headline ? whole_call : kernel_alone, call_is_headline ? kernel_alone : whole_call};
  std::vector<TimingSummary> timings = measure_interleaved(pair, timer, rule, monitor);
  if (call_is_headline) std::swap(timings[0], timings[1]);
  PreparedTimings result{std::move(timings[0]), std::move(timings[1]), std::nullopt};
  if (preparation_alone) {
    const TimedKernel only[] = {{alone, "timing its input preparation alone"}};
    result.of_preparation = std::move(measure_interleaved(only, timer, rule, monitor).front());
  }
  return result;
}

}  // namespace attnreplay
