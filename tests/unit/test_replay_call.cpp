// How the runner (replay/run/replay_call.cpp) times a kernel with an input preparation: the kernel alone
// and the whole call in turns, the preparation alone after them. In the turns, the preparation
// alone biased the kernel under a GPU's power cap (bench/results/2026-11-26-h100-turns).
#include <catch2/catch_test_macros.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "kernels/kernel.h"
#include "replay/run/replay_call.h"

using namespace attnreplay;

namespace {

HostTensor f32(std::vector<std::int64_t> shape, std::vector<double> values) {
  return HostTensor::from_doubles(DType::float32, std::move(shape), values);
}

// Every run of the kernel below, in order: 'P' its input preparation, 'K' its attention.
std::string& run_log() {
  static std::string log;
  return log;
}

class LoggedRuns final : public PreparedKernel {
 public:
  explicit LoggedRuns(HostTensor output) : output_(std::move(output)) {}
  void run() override { log('K'); }
  bool has_preparation() const override { return true; }
  void prepare_inputs() override { log('P'); }
  HostTensor output() override { return output_; }

 private:
  // Long enough that a turn (a tenth of min_time) holds a few runs.
  static void log(char what) {
    run_log() += what;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  HostTensor output_;
};

class LoggedPreparationKernel final : public Kernel {
 public:
  const KernelDescription& description() const override {
    static const KernelDescription d{"test-logged-preparation", "logs its runs (tests/unit/test_runner.cpp)", "cpu"};
    return d;
  }
  std::optional<std::string> unsupported_reason(const AttentionCall&) const override { return std::nullopt; }
  std::unique_ptr<PreparedKernel> prepare(const AttentionCall&, const KernelOptions&) const override {
    // Each query row the mean of V's rows: not the attention, which this test does not judge.
    return std::make_unique<LoggedRuns>(f32({1, 1, 2, 2}, {2, 3, 2, 3}));
  }
};
ATTNREPLAY_REGISTER_KERNEL(LoggedPreparationKernel);

// The log read as runs: 'A' the kernel alone (K), 'W' the whole call (P then K), 'S' the
// preparation alone (P not followed by K).
std::string runs_of(const std::string& log) {
  std::string runs;
  for (std::size_t i = 0; i < log.size(); ++i) {
    if (log[i] == 'K') {
      runs += 'A';
    } else if (i + 1 < log.size() && log[i + 1] == 'K') {
      runs += 'W';
      ++i;
    } else {
      runs += 'S';
    }
  }
  return runs;
}

}  // namespace

TEST_CASE("runner: the kernel and its whole call take turns, and the preparation alone runs after both") {
  AttentionCall call;
  call.q = f32({1, 1, 2, 2}, {0.5, -1, 2, 0.25});
  call.k = f32({1, 1, 3, 2}, {1, 0, -0.5, 2, 0.75, 1});
  call.v = f32({1, 1, 3, 2}, {1, 2, 3, 4, 2, 3});
  ReplayOptions options;
  options.kernels = {"test-logged-preparation"};
  options.reference_device = "cpu";
  options.time_preparation = true;  // the third timing, on request
  options.stopping.warmup_runs = 1;
  options.stopping.min_samples = 3;
  options.stopping.min_time_s = 0.1;  // turns of 20 ms (the least): several for each of the two
  options.stopping.criterion = StoppingCriterion::stdrel;
  options.stopping.max_noise = 1.0;  // met once min_samples and min_time are
  run_log().clear();

  const CallResult result = replay_call(call, options, "generated");

  REQUIRE(result.kernels.size() == 1);
  const KernelResult& k = result.kernels.front();
  INFO(k.reason);
  REQUIRE(k.timing);
  REQUIRE(k.timing_with_preparation);
  REQUIRE(k.timing_of_preparation);
  const std::string runs = runs_of(run_log());
  INFO("runs: " << runs);
  // Every run of the preparation alone comes after the last run of the kernel, alone or whole.
  const auto first_alone = runs.find('S');
  REQUIRE(first_alone != std::string::npos);
  CHECK(runs.find_first_of("AW", first_alone) == std::string::npos);
  // Before it, the kernel alone and the whole call alternate, turn by turn.
  int switches = 0;
  for (std::size_t i = 1; i < first_alone; ++i) switches += runs[i] != runs[i - 1];
  CHECK(switches >= 3);
  CHECK(k.timing_of_preparation->samples >= options.stopping.min_samples);
}
