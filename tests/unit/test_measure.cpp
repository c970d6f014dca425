// Sample statistics, the stopping rule and measure() (replay/measure/). A fake kernel counts its runs and a
// fake timer returns scripted durations, so which rule stops the loop is deterministic.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <chrono>
#include <random>
#include <stdexcept>
#include <cmath>
#include <functional>
#include <thread>
#include <vector>

#include "replay/measure/measure.h"
#include "replay/measure/timers.h"

using namespace attnreplay;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;

namespace {

class CountingKernel final : public PreparedKernel {
 public:
  explicit CountingKernel(std::chrono::microseconds sleep = std::chrono::microseconds(0)) : sleep_(sleep) {}
  void run() override {
    ++runs;
    if (sleep_.count() > 0) std::this_thread::sleep_for(sleep_);
  }
  HostTensor output() override { return {}; }
  void synchronize() override { ++synchronizations; }
  int runs = 0;
  int synchronizations = 0;

 private:
  std::chrono::microseconds sleep_;
};

// Runs the kernel once per sample and reports the n-th scripted duration (nullopt: discard).
class ScriptedTimer final : public SampleTimer {
 public:
  explicit ScriptedTimer(std::function<std::optional<double>(int)> script) : script_(std::move(script)) {}
  std::string method() const override { return "scripted"; }
  std::string cache() const override { return "n/a"; }
  std::vector<std::optional<double>> time_samples(PreparedKernel& kernel) override {
    runs_at_first_call = runs_at_first_call < 0 ? static_cast<CountingKernel&>(kernel).runs : runs_at_first_call;
    kernel.run();
    return {script_(calls++)};
  }
  int calls = 0;
  int runs_at_first_call = -1;

 private:
  std::function<std::optional<double>(int)> script_;
};

}  // namespace

TEST_CASE("timing: summarize_samples median of odd and even counts, min, max, mean") {
  const TimingSummary odd = summarize_samples({5.0, 1.0, 3.0});
  CHECK(odd.samples == 3);
  CHECK(odd.median_s == 3.0);
  CHECK(odd.min_s == 1.0);
  CHECK(odd.max_s == 5.0);
  CHECK(odd.mean_s == 3.0);
  CHECK_THAT(odd.measured_s, WithinAbs(9.0, 1e-12));
  const TimingSummary even = summarize_samples({4.0, 1.0, 10.0, 2.0});
  CHECK(even.median_s == 3.0);  // mean of the middle two, 2 and 4
  CHECK(even.min_s == 1.0);
  CHECK(even.max_s == 10.0);
  CHECK(even.mean_s == 4.25);
}

TEST_CASE("timing: stdev_rel is the sample standard deviation over the mean") {
  // [1, 2, 3]: mean 2, sample variance 1, so stdev_rel = 0.5.
  CHECK_THAT(summarize_samples({1.0, 2.0, 3.0}).stdev_rel, WithinAbs(0.5, 1e-15));
  // [2, 4, 4, 4, 5, 5, 7, 9]: mean 5, sum of squares 32, sample variance 32/7.
  CHECK_THAT(summarize_samples({2, 4, 4, 4, 5, 5, 7, 9}).stdev_rel, WithinRel(std::sqrt(32.0 / 7) / 5, 1e-14));
  CHECK(summarize_samples({7.0, 7.0, 7.0}).stdev_rel == 0.0);
  CHECK(summarize_samples({7.0}).stdev_rel == 0.0);  // one sample has no spread
  const TimingSummary none = summarize_samples({});
  CHECK(none.samples == 0);
  CHECK(none.untimed());
  // No sample, no time: NaN (null in the JSON), never a median of 0 s.
  CHECK(std::isnan(none.median_s));
  CHECK(std::isnan(none.min_s));
  CHECK(std::isnan(none.mean_s));
}

TEST_CASE("timing: noise_settled needs a full window that varies by under 5% of the latest") {
  CHECK_FALSE(noise_settled(std::vector<double>(15, 0.1)));   // window of 16 not yet full
  CHECK(noise_settled(std::vector<double>(16, 0.1)));
  std::vector<double> wobbly(16, 0.1);
  wobbly[3] = 0.106;  // range 0.006 > 5% of 0.1
  CHECK_FALSE(noise_settled(wobbly));
  wobbly[3] = 0.104;  // range 0.004 < 0.005
  CHECK(noise_settled(wobbly));
  // Only the last `window` values count.
  std::vector<double> settled_late{5.0, 0.01};
  settled_late.insert(settled_late.end(), 16, 0.2);
  CHECK(noise_settled(settled_late));
  CHECK_FALSE(noise_settled(std::vector<double>(16, 0.0)));  // zero noise is converged, not settled
  CHECK(noise_settled({0.3, 0.3, 0.3}, 3));
}

TEST_CASE("timing: constant samples converge once min_samples and min_time are met") {
  CountingKernel kernel;
  ScriptedTimer timer([](int) { return 0.0625; });  // exact in binary: sums carry no rounding
  StoppingRule rule;
  rule.warmup_runs = 3;
  rule.min_samples = 5;
  rule.min_time_s = 0.5;  // 8 samples of 62.5 ms: min_time binds after min_samples
  rule.timeout_s = 30;
  const TimingSummary t = measure(kernel, timer, rule);
  CHECK(t.stop_reason == "converged");
  CHECK(t.samples == 8);
  CHECK(timer.calls == 8);
  CHECK(t.discarded == 0);
  CHECK(t.median_s == 0.0625);
  CHECK(t.stdev_rel == 0.0);
  CHECK(t.measured_s == 0.5);
  CHECK(t.method == "scripted");
  CHECK(t.cache == "n/a");
  // Warm-up runs happen before the first sample and are not sampled.
  CHECK(t.warmup_runs == 3);
  CHECK(timer.runs_at_first_call == 3);
  CHECK(kernel.runs == 3 + 8);
  CHECK(kernel.synchronizations == 3);  // measure() syncs warm-ups; the timer owns the rest
}

TEST_CASE("timing: min_samples binds when samples are long") {
  CountingKernel kernel;
  ScriptedTimer timer([](int) { return 1.0; });
  StoppingRule rule;
  rule.warmup_runs = 0;
  rule.min_samples = 7;
  rule.min_time_s = 0.1;
  const TimingSummary t = measure(kernel, timer, rule);
  CHECK(t.stop_reason == "converged");
  CHECK(t.samples == 7);
  CHECK(timer.runs_at_first_call == 0);
}

TEST_CASE("timing: steady noise above max_noise stops as noise-settled") {
  // 1, 2, 3 ms in turn: a robust spread of about 0.74 (MAD 1 ms over the median 2 ms), never
  // under 2%, but it stops changing.
  CountingKernel kernel;
  ScriptedTimer timer([](int n) { return 0.001 * (1 + n % 3); });
  StoppingRule rule;
  rule.warmup_runs = 1;
  rule.min_samples = 5;
  rule.min_time_s = 0.0;
  rule.timeout_s = 30;
  const TimingSummary t = measure(kernel, timer, rule);
  CHECK(t.stop_reason == "noise-settled");
  CHECK(t.samples >= 5 + 15);  // a full window of 16 noise values after min_samples
  CHECK(t.samples < 1000);
  CHECK(t.stdev_rel > 0.3);
  CHECK(t.median_s >= 0.001);
}

TEST_CASE("timing: noisy samples that never settle stop at the timeout") {
  // min_samples far above what fits in the timeout keeps the noise rule from ever deciding; each
  // run sleeps 2 ms of real time, so the 50 ms wall-clock timeout ends it.
  CountingKernel kernel(std::chrono::microseconds(2000));
  ScriptedTimer timer([](int n) { return 0.001 * (1 + n % 7); });
  StoppingRule rule;
  rule.warmup_runs = 0;
  rule.min_samples = 100000;
  rule.max_samples = 100000;
  rule.timeout_s = 0.05;
  const auto start = std::chrono::steady_clock::now();
  const TimingSummary t = measure(kernel, timer, rule);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(t.stop_reason == "timeout");
  CHECK(t.samples >= 1);
  CHECK(t.samples <= 26);  // at most 50 ms / 2 ms, plus the one that crossed the line
  CHECK(wall < 2.0);
}

TEST_CASE("timing: max_samples caps the count") {
  CountingKernel kernel;
  ScriptedTimer timer([](int n) { return 0.001 * (1 + (n * n) % 13); });
  StoppingRule rule;
  rule.warmup_runs = 0;
  rule.min_samples = 100000;
  rule.max_samples = 40;
  rule.timeout_s = 30;
  const TimingSummary t = measure(kernel, timer, rule);
  CHECK(t.stop_reason == "max-samples");
  CHECK(t.samples == 40);
}

namespace {

// Times runs in batches, as the queued-event and CUPTI timers do: four runs a call, the second of
// each batch discarded; or, with `empty`, no sample at all.
class BatchTimer final : public SampleTimer {
 public:
  std::string method() const override { return "batched"; }
  std::string cache() const override { return "n/a"; }
  std::vector<std::optional<double>> time_samples(PreparedKernel& kernel) override {
    ++calls;
    if (empty) return {};
    for (int i = 0; i < 4; ++i) kernel.run();
    return {0.001 * calls, std::nullopt, 0.001 * calls, 0.001 * calls};
  }
  int calls = 0;
  bool empty = false;
};

}  // namespace

TEST_CASE("timing: a timer's batch of samples is taken in order, and sampling may stop inside one") {
  CountingKernel kernel;
  BatchTimer timer;
  StoppingRule rule;
  rule.warmup_runs = 0;
  rule.min_samples = 100000;
  rule.max_samples = 5;
  rule.timeout_s = 30;
  const TimingSummary t = measure(kernel, timer, rule);
  // Batch 1: three kept, one discarded; batch 2: one kept, one discarded, one kept (the fifth).
  CHECK(t.stop_reason == "max-samples");
  CHECK(timer.calls == 2);
  CHECK(t.samples == 5);
  CHECK(t.discarded == 2);
  CHECK(t.min_s == 0.001);
  CHECK(t.max_s == 0.002);
  timer.empty = true;
  CHECK_THROWS_AS(measure(kernel, timer, rule), std::logic_error);
}

TEST_CASE("timing: discarded samples are counted and left out of the statistics") {
  // Every third sample is rejected (e.g. taken while the clock throttled); those would read 1 s.
  CountingKernel kernel;
  ScriptedTimer timer([](int n) -> std::optional<double> {
    if (n % 3 == 2) return std::nullopt;
    return 0.01;
  });
  StoppingRule rule;
  rule.warmup_runs = 0;
  rule.min_samples = 6;
  rule.min_time_s = 0.0;
  const TimingSummary t = measure(kernel, timer, rule);
  CHECK(t.stop_reason == "converged");
  CHECK(t.samples == 6);
  CHECK(t.discarded == 2);  // calls 2 and 5 of 0..7
  CHECK(timer.calls == 8);
  CHECK(t.max_s == 0.01);
}

TEST_CASE("timing: a timer that discards everything still stops at the timeout") {
  // "At --timeout seconds in any case" (docs/metrics.md): a GPU that always throttles must not
  // hang the run.
  CountingKernel kernel(std::chrono::microseconds(1000));
  ScriptedTimer timer([](int) -> std::optional<double> { return std::nullopt; });
  StoppingRule rule;
  rule.warmup_runs = 0;
  rule.timeout_s = 0.03;
  const TimingSummary t = measure(kernel, timer, rule);
  CHECK(t.stop_reason == "timeout");
  CHECK(t.samples == 0);
  CHECK(t.discarded == timer.calls);
  CHECK(t.discarded >= 1);
  CHECK(t.untimed());
  CHECK(std::isnan(t.median_s));
  const std::string reason = untimed_reason(t);
  CHECK(reason.find("not timed") == 0);
  CHECK(reason.find(std::to_string(t.discarded) + " samples") != std::string::npos);
}

TEST_CASE("timing: the CPU clock timer measures a kernel that sleeps") {
  CountingKernel kernel(std::chrono::microseconds(3000));
  const auto timer_made = make_cpu_timer();
  SampleTimer& timer = *timer_made;
  const auto samples = timer.time_samples(kernel);
  REQUIRE(samples.size() == 1);
  const auto seconds = samples.front();
  REQUIRE(seconds.has_value());
  CHECK(*seconds >= 0.003);
  CHECK(*seconds < 1.0);
  CHECK(kernel.synchronizations == 1);  // waits for the work, as a GPU timer must
  CHECK(timer.method() == "cpu-steady-clock");
}

TEST_CASE("timing: describe() names the rule's numbers") {
  StoppingRule rule;
  rule.max_noise = 0.005;
  rule.timeout_s = 7;
  const std::string text = rule.describe();
  CHECK(text.find("0.5%") != std::string::npos);
  CHECK(text.find("timeout 7 s") != std::string::npos);
}

namespace {

// A timer with state per kernel, as the CUDA-graph and CUPTI timers have: it records when
// measure() calls its hooks, and each sample stands for `runs` runs.
class KernelScopedTimer final : public SampleTimer {
 public:
  explicit KernelScopedTimer(int runs) : runs_(runs) {}
  std::string method() const override { return "scoped"; }
  std::string cache() const override { return "hot-l2"; }
  void begin_kernel(PreparedKernel& kernel) override {
    ++begins;
    runs_at_begin = static_cast<CountingKernel&>(kernel).runs;
    if (fail_begin) throw std::runtime_error("not capturable in a CUDA graph: test");
    open = true;
  }
  void end_kernel() noexcept override {
    ++ends;
    open = false;
  }
  int runs_per_sample() const override { return runs_; }
  std::vector<std::optional<double>> time_samples(PreparedKernel& kernel) override {
    REQUIRE(open);
    if (throw_at == calls++) throw std::runtime_error("sample failed");
    for (int i = 0; i < runs_; ++i) kernel.run();
    return {0.0625 / runs_};  // per run; each sample is 62.5 ms of GPU time
  }
  int begins = 0, ends = 0, calls = 0, runs_at_begin = -1, throw_at = -1;
  bool open = false, fail_begin = false;

 private:
  int runs_;
};

}  // namespace

TEST_CASE("timing: measure() opens the timer's per-kernel state after warm-up and always closes it") {
  CountingKernel kernel;
  KernelScopedTimer timer(1);
  StoppingRule rule;
  rule.warmup_runs = 2;
  rule.min_samples = 3;
  rule.min_time_s = 0;
  const TimingSummary t = measure(kernel, timer, rule);
  CHECK(t.samples == 3);
  CHECK(timer.begins == 1);
  CHECK(timer.ends == 1);
  CHECK(timer.runs_at_begin == 2);  // after the warm-up runs
  CHECK(t.runs_per_sample == 1);

  KernelScopedTimer failing(1);
  failing.throw_at = 1;
  CHECK_THROWS_WITH(measure(kernel, failing, rule), "sample failed");
  CHECK(failing.ends == 1);  // closed although a sample threw

  KernelScopedTimer refusing(1);
  refusing.fail_begin = true;
  CHECK_THROWS_WITH(measure(kernel, refusing, rule), "not capturable in a CUDA graph: test");
  CHECK(refusing.calls == 0);
  CHECK(refusing.ends == 1);
}

TEST_CASE("timing: samples of K runs count K times toward min_time, and say so") {
  // Each sample is 62.5 ms / 4 per run but 62.5 ms of GPU time: 0.5 s of it takes 8 samples, as
  // with one run of 62.5 ms per sample, not 32.
  CountingKernel kernel;
  KernelScopedTimer timer(4);
  StoppingRule rule;
  rule.warmup_runs = 0;
  rule.min_samples = 5;
  rule.min_time_s = 0.5;
  rule.timeout_s = 30;
  const TimingSummary t = measure(kernel, timer, rule);
  CHECK(t.stop_reason == "converged");
  CHECK(t.samples == 8);
  CHECK(t.median_s == 0.015625);  // per run
  CHECK(t.runs_per_sample == 4);
  CHECK(t.measured_s == 0.5);  // GPU time sampled, all runs counted
  CHECK(kernel.runs == 32);
}

namespace {

// Hands measure() fixed readings and records when it was started and stopped.
class FixedMonitor final : public ClockMonitor {
 public:
  explicit FixedMonitor(const CountingKernel& kernel) : kernel_(kernel) {}
  void start() override {
    ++starts;
    runs_at_start = kernel_.runs;
  }
  ClockReadings stop() noexcept override {
    ++stops;
    return {{1600, 1590, 1980, 1610}, {699, 701, 300, 700}, 3};
  }
  int starts = 0, stops = 0, runs_at_start = -1;

 private:
  const CountingKernel& kernel_;
};

}  // namespace

TEST_CASE("timing: summarize_clocks gives median, min and max clock, median power and the capped share") {
  TimingSummary t;
  summarize_clocks({{1600, 1590, 1980, 1610}, {699, 701, 300, 700}, 3}, t);
  CHECK(t.sm_clock_median_mhz == 1605.0);
  CHECK(t.sm_clock_min_mhz == 1590.0);
  CHECK(t.sm_clock_max_mhz == 1980.0);
  CHECK(t.power_median_w == 699.5);
  CHECK(t.power_capped_fraction == 0.75);

  TimingSummary none;  // nothing read: zeros, which the JSON writes as null
  summarize_clocks({}, none);
  CHECK(none.sm_clock_median_mhz == 0.0);
  CHECK(none.power_median_w == 0.0);
  CHECK(none.power_capped_fraction == 0.0);
}

TEST_CASE("timing: measure() reads the clocks over the samples, after the warm-up, and stops on a throw") {
  CountingKernel kernel;
  FixedMonitor monitor(kernel);
  ScriptedTimer timer([](int) { return 1e-3; });
  StoppingRule rule;
  rule.warmup_runs = 2;
  rule.min_samples = 3;
  rule.min_time_s = 0;
  const TimingSummary t = measure(kernel, timer, rule, &monitor);
  CHECK(monitor.starts == 1);
  CHECK(monitor.stops == 1);
  CHECK(monitor.runs_at_start == 2);  // after the warm-up runs
  CHECK(t.sm_clock_median_mhz == 1605.0);
  CHECK(t.power_median_w == 699.5);
  CHECK(t.power_capped_fraction == 0.75);

  // Without a monitor, nothing is read.
  CHECK(measure(kernel, timer, rule).sm_clock_median_mhz == 0.0);

  KernelScopedTimer failing(1);
  failing.throw_at = 0;
  FixedMonitor stopped(kernel);
  CHECK_THROWS_WITH(measure(kernel, failing, rule, &stopped), "sample failed");
  CHECK(stopped.starts == 1);
  CHECK(stopped.stops == 1);
}

TEST_CASE("timing: spread_rel is 1.4826 MAD over the median, untouched by an outlier") {
  // Median 3, absolute deviations {2, 1, 0, 1, 97}: MAD 1.
  CHECK_THAT(robust_spread({1, 2, 3, 4, 100}), WithinRel(1.4826 / 3, 1e-14));
  CHECK_THAT(summarize_samples({4, 3, 100, 1, 2}).spread_rel, WithinRel(1.4826 / 3, 1e-14));
  // Even counts take the mean of the middle two: median 2.5, deviations {1.5, 0.5, 0.5, 1.5}: MAD 1.
  CHECK_THAT(robust_spread({1, 2, 3, 4}), WithinRel(1.4826 / 2.5, 1e-14));
  CHECK(robust_spread({5.0}) == 0.0);
  CHECK(robust_spread({5.0, 5.0, 5.0}) == 0.0);
}

TEST_CASE("timing: rare outliers do not keep a short kernel sampling to the cap") {
  // A decode-sized kernel: 15 us with 0.1 % jitter, and one sample in 40 ten times longer (a
  // preemption, a clock dip). The standard deviation never gets near 0.5 %; the robust spread does.
  CountingKernel kernel;
  ScriptedTimer timer([](int n) { return n % 40 == 39 ? 150e-6 : 15e-6 * (1 + 0.001 * ((n * 7) % 3)); });
  StoppingRule rule = StoppingRule::gpu_stdrel();
  rule.min_time_s = 0.01;
  const TimingSummary t = measure(kernel, timer, rule);
  CHECK(t.stop_reason == "converged");
  CHECK(t.samples < 2000);
  CHECK(t.stdev_rel > 0.5);
  CHECK(t.spread_rel < 0.005);
  CHECK_THAT(t.median_s, WithinRel(15.015e-6, 1e-3));
}

TEST_CASE("timing: a spread above max_noise stops once the median is known") {
  // A 15 us kernel whose samples spread by about 2 % (CUDA events' resolution): nvbench's 0.5 s of
  // GPU time takes some 33,000 samples, and then the noise is still above its 0.5 %, but the
  // median's standard error is a tenth of that.
  CountingKernel kernel;
  std::mt19937_64 generator(5);
  ScriptedTimer timer([&generator](int) {
    return 15e-6 * (1 + 0.04 * (static_cast<double>(generator() >> 11) * 0x1.0p-53 - 0.5));
  });
  const StoppingRule rule = StoppingRule::gpu_stdrel();
  const TimingSummary t = measure(kernel, timer, rule);
  CHECK(t.stop_reason == "median-settled");
  CHECK(t.spread_rel > rule.max_noise);
  CHECK(t.samples >= 33333);  // min_time binds first
  CHECK(t.samples < 34000);
  CHECK(1.2533 * t.spread_rel / std::sqrt(t.samples) < 0.1 * rule.max_noise);
  CHECK_THAT(t.median_s, WithinRel(15e-6, 1e-3));
}

namespace {

// Gives each kernel its own scripted durations, from the count of samples taken of all kernels so
// far (a clock that drifts), and records whose turn each sample was.
class TurnTimer final : public SampleTimer {
 public:
  using Script = std::function<std::optional<double>(const PreparedKernel&, int)>;
  TurnTimer(std::string cache, Script script) : cache_(std::move(cache)), script_(std::move(script)) {}
  std::string method() const override { return "turns"; }
  std::string cache() const override { return cache_; }
  void begin_kernel(PreparedKernel& kernel) override {
    if (&kernel == fail_begin_of) throw std::runtime_error("not capturable in a CUDA graph: test");
    ++begins;
  }
  void end_kernel() noexcept override { ++ends; }
  std::vector<std::optional<double>> time_samples(PreparedKernel& kernel) override {
    kernel.run();
    order.push_back(&kernel);
    if (&kernel == throw_in) throw std::runtime_error("sample failed");
    return {script_(kernel, taken++)};
  }
  std::vector<const PreparedKernel*> order;
  int begins = 0, ends = 0, taken = 0;
  const PreparedKernel* fail_begin_of = nullptr;
  const PreparedKernel* throw_in = nullptr;

 private:
  std::string cache_;
  Script script_;
};

// The kernels in the order of their turns, each turn once: {a, b, a, b, ...}.
std::vector<const PreparedKernel*> turns_of(const std::vector<const PreparedKernel*>& order) {
  std::vector<const PreparedKernel*> turns;
  for (const PreparedKernel* kernel : order) {
    if (turns.empty() || turns.back() != kernel) turns.push_back(kernel);
  }
  return turns;
}

// A clock that reads 1000 MHz more each time it is started, so each turn's readings tell its turn.
class CountingMonitor final : public ClockMonitor {
 public:
  void start() override { ++starts; }
  ClockReadings stop() noexcept override { return {{1000.0 + starts}, {700.0}, 0}; }
  int starts = 0;
};

}  // namespace

TEST_CASE("timing: measure_interleaved takes turns of a tenth of min_time until every kernel meets the rule") {
  CountingKernel a, b;
  // a's samples are 1/64 s, b's 1/32 s: a turn of 0.05 s is 4 of a's and 2 of b's.
  TurnTimer timer("cold-l2", [&a](const PreparedKernel& kernel, int) { return &kernel == &a ? 0.015625 : 0.03125; });
  CountingMonitor monitor;
  StoppingRule rule;
  rule.warmup_runs = 2;
  rule.min_time_s = 0.5;
  rule.min_samples = 20;  // a meets the rule after 8 turns (32 samples), b after 10 (20 samples)
  const TimedKernel kernels[] = {{a, {}}, {b, {}}};
  const std::vector<TimingSummary> t = measure_interleaved(kernels, timer, rule, &monitor);
  REQUIRE(t.size() == 2);
  // a goes on taking turns after its rule is met, so that its samples span b's.
  CHECK(t[0].samples == 40);
  CHECK(t[1].samples == 20);
  CHECK(t[0].stop_reason == "converged");
  CHECK(t[1].stop_reason == "converged");
  CHECK(t[0].median_s == 0.015625);
  CHECK(t[1].median_s == 0.03125);
  CHECK(t[0].measured_s == 0.625);
  CHECK(t[1].measured_s == 0.625);
  const auto turns = turns_of(timer.order);
  REQUIRE(turns.size() == 20);
  for (std::size_t i = 0; i < turns.size(); ++i) CHECK(turns[i] == (i % 2 ? &b : &a));
  CHECK(timer.begins == 20);
  CHECK(timer.ends == 20);
  // Cold-L2 samples need no run before a turn: the warm-up, then the samples.
  CHECK(a.runs == 2 + 40);
  CHECK(b.runs == 2 + 20);
  // Each kernel's clocks are its own turns' readings: a's the odd starts, b's the even ones.
  CHECK(monitor.starts == 20);
  CHECK(t[0].sm_clock_min_mhz == 1001.0);
  CHECK(t[0].sm_clock_max_mhz == 1019.0);
  CHECK(t[1].sm_clock_min_mhz == 1002.0);
  CHECK(t[1].sm_clock_max_mhz == 1020.0);
}

TEST_CASE("timing: measure_interleaved runs a kernel once before each later turn where samples are hot-L2 ones") {
  CountingKernel a, b;
  TurnTimer timer("hot-l2", [](const PreparedKernel&, int) { return 0.03125; });
  StoppingRule rule;
  rule.warmup_runs = 1;
  rule.min_time_s = 0.3125;  // turns of 1/32 s: one sample each, ten turns each
  rule.min_samples = 2;
  const TimedKernel kernels[] = {{a, {}}, {b, {}}};
  const auto t = measure_interleaved(kernels, timer, rule);
  CHECK(t[0].samples == 10);
  CHECK(t[1].samples == 10);
  CHECK(a.runs == 1 + 10 + 9);
  CHECK(b.runs == 1 + 10 + 9);
}

TEST_CASE("timing: interleaved medians see the same drifting clock, where one kernel after the other do not") {
  // Every sample taken makes the next 0.02 % slower (a clock sinking under a power cap); b's work is
  // 1.1 times a's. Timed one after the other, b's samples come later and slower, and b - a is
  // inflated; in turns, it is b - a at the clock both saw.
  const auto make_script = [](const PreparedKernel* a) {
    return [a](const PreparedKernel& kernel, int taken) -> std::optional<double> {
      return (&kernel == a ? 1e-3 : 1.1e-3) * (1 + 2e-4 * taken);
    };
  };
  StoppingRule rule;
  rule.warmup_runs = 0;
  rule.min_time_s = 0.2;
  rule.max_noise = 0.5;  // stop as soon as min_time is met
  CountingKernel a, b;
  TurnTimer apart("cold-l2", make_script(&a));
  const double apart_difference = measure(b, apart, rule).median_s - measure(a, apart, rule).median_s;
  // b first (its samples are the earlier ones): measured apart, b - a is far under its 0.1 ms.
  CHECK(apart_difference < 0.07e-3);

  TurnTimer turns("cold-l2", make_script(&a));
  const TimedKernel kernels[] = {{a, {}}, {b, {}}};
  const auto t = measure_interleaved(kernels, turns, rule);
  const double difference = t[1].median_s - t[0].median_s;
  // b - a at the clock of the middle of the ~380 samples, 1.04 times the first one's, to within
  // what half a turn between a's samples and b's drifts. Apart, it is 30 % off.
  CHECK_THAT(difference, WithinRel(0.1e-3 * 1.04, 0.05));
}

TEST_CASE("timing: measure_interleaved names the kernel whose turn failed, and always closes the timer") {
  CountingKernel a, b;
  StoppingRule rule;
  rule.warmup_runs = 0;
  rule.min_time_s = 0.1;
  rule.min_samples = 2;
  const TimedKernel kernels[] = {{a, {}}, {b, "timing with its input preparation"}};

  TurnTimer throwing("cold-l2", [](const PreparedKernel&, int) { return 0.01; });
  throwing.throw_in = &b;
  CHECK_THROWS_WITH(measure_interleaved(kernels, throwing, rule), "timing with its input preparation: sample failed");
  CHECK(throwing.begins == 2);
  CHECK(throwing.ends == 2);

  TurnTimer refusing("cold-l2", [](const PreparedKernel&, int) { return 0.01; });
  refusing.fail_begin_of = &b;
  CHECK_THROWS_WITH(measure_interleaved(kernels, refusing, rule),
                    "timing with its input preparation: not capturable in a CUDA graph: test");
  CHECK(refusing.ends == 2);

  // An unnamed kernel's error goes out as it came.
  TurnTimer first("cold-l2", [](const PreparedKernel&, int) { return 0.01; });
  first.throw_in = &a;
  CHECK_THROWS_WITH(measure_interleaved(kernels, first, rule), "sample failed");
}

TEST_CASE("timing: with no min_time, interleaved turns are one sample each") {
  CountingKernel a, b;
  TurnTimer timer("cold-l2", [](const PreparedKernel&, int) { return 1e-3; });
  StoppingRule rule;
  rule.warmup_runs = 0;
  rule.min_time_s = 0;
  rule.min_samples = 3;
  const TimedKernel kernels[] = {{a, {}}, {b, {}}};
  const auto t = measure_interleaved(kernels, timer, rule);
  CHECK(t[0].samples == 3);
  CHECK(t[1].samples == 3);
  CHECK(turns_of(timer.order).size() == 6);
}

TEST_CASE("timing: a budgeted second kernel samples at most its share of the first's time, past the minimum") {
  CountingKernel a, b;
  std::mt19937 random(5);
  std::lognormal_distribution<double> noise(0.0, 0.03);
  // a: 1 ms with 3 % noise, precise after a few hundred samples; b: 4 ms that swing by 2x, never.
  TurnTimer timer("cold-l2", [&](const PreparedKernel& kernel, int taken) -> std::optional<double> {
    return &kernel == &a ? 1e-3 * noise(random) : (taken % 4 < 2 ? 4e-3 : 8e-3);
  });
  StoppingRule rule = StoppingRule::gpu_default();
  rule.min_time_s = 0;
  rule.warmup_runs = 0;
  const TimedKernel kernels[] = {{a, {}}, {b, "with its preparation", 0.5}};
  const auto t = measure_interleaved(kernels, timer, rule);
  CHECK(t[0].stop_reason == "precise");
  CHECK(t[1].stop_reason == "budget");
  CHECK(t[0].samples > 100);
  // Half of a's sampled time, give or take b's last sample and a's turn after it stopped.
  CHECK(t[1].measured_s <= 0.5 * t[0].measured_s + 8e-3);
  CHECK(t[1].measured_s >= 0.5 * (t[0].measured_s - 2e-3));
  // The minimum samples come first, whatever the budget.
  const TimedKernel tight[] = {{a, {}}, {b, "with its preparation", 1e-6}};
  CHECK(measure_interleaved(tight, timer, rule)[1].samples == rule.min_samples);
}

// ---- The precision rule on synthetic sample streams ----

namespace {

// Samples whose true median is `median`: lognormal noise of relative spread `sigma`, and, with
// `outliers`, one sample in 50 three times as long (a preempted run).
std::vector<double> stream(std::mt19937& random, double median, double sigma, std::size_t count, bool outliers = false) {
  std::normal_distribution<double> normal(0.0, sigma);
  std::vector<double> samples;
  for (std::size_t i = 0; i < count; ++i) {
    double s = median * std::exp(normal(random));
    if (outliers && i % 50 == 49) s *= 3;
    samples.push_back(s);
  }
  return samples;
}

// Feeds a stream to the rule until it stops; returns the samples it took.
std::size_t samples_to_stop(const StoppingRule& rule, const std::vector<double>& samples, std::string& reason) {
  Sampling sampling(rule);
  std::size_t taken = 0;
  for (double s : samples) {
    sampling.add(s, 1);
    ++taken;
    if (sampling.stopped()) break;
  }
  sampling.time_out();
  reason = sampling.summary("test", "n/a").stop_reason;
  return taken;
}

}  // namespace

TEST_CASE("precision rule: the median's interval from order statistics, wider for fewer samples") {
  CHECK_FALSE(median_interval({1, 2, 3, 4, 5}).has_value());
  // summarize_samples reads the same ranks off its sorted samples.
  const std::vector<double> unsorted = {9, 2, 7, 4, 4, 11, 1, 8, 3, 6, 5, 10, 12, 0.5};
  const auto selected = median_interval(unsorted);
  REQUIRE(selected);
  const TimingSummary summary = summarize_samples(unsorted);
  CHECK(summary.median_low_s == selected->low);
  CHECK(summary.median_high_s == selected->high);
  CHECK(std::isnan(summarize_samples({1, 2, 3, 4, 5}).median_low_s));
  std::vector<double> ordered;
  for (int i = 1; i <= 100; ++i) ordered.push_back(i);
  const auto interval = median_interval(ordered);
  REQUIRE(interval);
  CHECK(interval->median == 50.5);
  // Ranks 40 and 61 of 100 (n/2 -+ 1.96 sqrt(n)/2, widened to whole ranks).
  CHECK(interval->low == 40);
  CHECK(interval->high == 61);
  std::mt19937 random(7);
  const double narrow = median_interval(stream(random, 1.0, 0.05, 2000))->relative_half_width();
  const double wide = median_interval(stream(random, 1.0, 0.05, 50))->relative_half_width();
  CHECK(narrow < wide / 3);
}

TEST_CASE("precision rule: the interval covers the true median about 95 % of the time") {
  std::mt19937 random(11);
  int covered = 0;
  const int trials = 2000;
  for (int t = 0; t < trials; ++t) {
    const auto interval = median_interval(stream(random, 2.0, 0.03, 40 + t % 60, t % 3 == 0));
    REQUIRE(interval);
    covered += interval->low <= 2.0 && 2.0 <= interval->high;
  }
  const double coverage = static_cast<double>(covered) / trials;
  INFO("coverage " << coverage);
  CHECK(coverage > 0.93);
  CHECK(coverage < 0.99);
}

TEST_CASE("precision rule: stops early on quiet samples, late on noisy ones, and the median it gives is the true one") {
  StoppingRule rule = StoppingRule::gpu_default();
  rule.min_time_s = 0;
  std::mt19937 random(3);
  std::string reason;

  const auto quiet = stream(random, 1e-3, 0.002, 100000);
  const std::size_t quiet_taken = samples_to_stop(rule, quiet, reason);
  CHECK(reason == "precise");
  CHECK(quiet_taken <= 20);

  const auto noisy = stream(random, 1e-3, 0.05, 100000, true);
  const std::size_t noisy_taken = samples_to_stop(rule, noisy, reason);
  CHECK(reason == "precise");
  CHECK(noisy_taken > 20 * quiet_taken);
  // +-0.5 % with 95 % confidence: the stopped median lies well within 2 % of the truth.
  const double median = summarize_samples({noisy.begin(), noisy.begin() + static_cast<std::ptrdiff_t>(noisy_taken)}).median_s;
  CHECK_THAT(median, WithinRel(1e-3, 0.02));

  // Never before min_samples, however quiet.
  rule.min_samples = 30;
  CHECK(samples_to_stop(rule, quiet, reason) >= 30);
}

TEST_CASE("precision rule: the defaults, and nvbench's rule behind --stopping stdrel") {
  CHECK(StoppingRule::gpu_default().criterion == StoppingCriterion::precision);
  CHECK(StoppingRule::gpu_default().precision == 0.005);
  CHECK(StoppingRule::cpu_default().precision == 0.05);
  CHECK(StoppingRule::gpu_stdrel().criterion == StoppingCriterion::stdrel);
  CHECK(StoppingRule::gpu_stdrel().min_time_s == 0.5);
  CHECK(parse_stopping_criterion("stdrel") == StoppingCriterion::stdrel);
  CHECK_FALSE(parse_stopping_criterion("noise"));
  CHECK_THAT(StoppingRule::gpu_default().describe(), Catch::Matchers::ContainsSubstring("+-0.5%"));
  const TimingSummary summary = summarize_samples({5, 1, 4, 2, 3, 6, 7, 8, 9, 10});
  CHECK(summary.median_low_s <= summary.median_s);
  CHECK(summary.median_high_s >= summary.median_s);
  CHECK(std::isnan(summarize_samples({1, 2}).median_low_s));
}
