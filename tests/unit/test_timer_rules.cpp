// What the GPU timers decide without a GPU (replay/measure/timer_rules.cpp): the --timing values, the
// throttle guard, runs per CUDA-graph replay, and which CUPTI records belong to one run.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>

#include <limits>

#include "replay/measure/timer_rules.h"
#include "replay/measure/timers.h"

using namespace attnreplay;
using Catch::Matchers::WithinAbs;
using Kind = ActivityRecord::Kind;

TEST_CASE("gpu_timing: --timing takes event, graph, cupti and queued, and names what results record") {
  CHECK(parse_timing_method("event") == TimingMethod::event);
  CHECK(parse_timing_method("graph") == TimingMethod::graph);
  CHECK(parse_timing_method("cupti") == TimingMethod::cupti);
  CHECK(parse_timing_method("queued") == TimingMethod::queued);
  for (const char* bad : {"", "Event", "cuda-event", "graphs", "cupti ", "nvbench"}) {
    CHECK_FALSE(parse_timing_method(bad).has_value());
  }
  CHECK(timing_method_label(TimingMethod::event) == "cuda-event");
  CHECK(timing_method_label(TimingMethod::graph) == "cuda-graph");
  CHECK(timing_method_label(TimingMethod::cupti) == "cupti");
  CHECK(timing_method_label(TimingMethod::queued) == "cuda-event-queued");
  // The names the parser lists are exactly those it accepts, and round-trip through the flag.
  for (const std::string& name : timing_method_names()) {
    const auto method = parse_timing_method(name);
    REQUIRE(method.has_value());
    CHECK(timing_method_flag(*method) == name);
  }
  CHECK(timing_method_names().size() == 4);
}

TEST_CASE("gpu_timing: the throttle guard discards samples under the threshold of the rated clock") {
  ThrottleGuard guard(/*rated_mhz=*/1980, /*threshold=*/0.75);  // limit 1485 MHz
  CHECK(guard.accept(1980));
  CHECK(guard.accept(1500));
  CHECK(guard.accept(1485));
  CHECK_FALSE(guard.accept(1484));
  CHECK_FALSE(guard.accept(345));
  CHECK(guard.accept(0));  // the clock could not be measured: kept
}

TEST_CASE("gpu_timing: without a rated clock, the highest clock seen stands in for it") {
  ThrottleGuard guard(/*rated_mhz=*/0, /*threshold=*/0.75);
  CHECK(guard.accept(1000));  // the first sample sets the bar
  CHECK(guard.accept(800));   // 0.8 of 1000
  CHECK(guard.accept(2000));
  CHECK_FALSE(guard.accept(1400));  // under 0.75 of 2000
  CHECK(guard.accept(1500));
}

TEST_CASE("gpu_timing: runs_filling gives the runs that last the target, within 1 and the cap") {
  // As a graph replay is sized: about 1 ms, at most 100 runs.
  const auto graph_runs_per_replay = [](double single_run_s) { return runs_filling(single_run_s, 1e-3, 100); };
  CHECK(graph_runs_per_replay(2e-3) == 1);    // one run is long enough
  CHECK(graph_runs_per_replay(1e-3) == 1);
  CHECK(graph_runs_per_replay(0.4e-3) == 3);  // ceil(2.5)
  CHECK(graph_runs_per_replay(0.1e-3) == 10);
  CHECK(graph_runs_per_replay(20e-6) == 50);
  CHECK(graph_runs_per_replay(5e-6) == 100);  // would be 200: capped
  CHECK(graph_runs_per_replay(1e-9) == 100);
  // A failed estimate gets the cap, never 0 or a negative count.
  CHECK(graph_runs_per_replay(0) == 100);
  CHECK(graph_runs_per_replay(-1) == 100);
  CHECK(graph_runs_per_replay(std::numeric_limits<double>::quiet_NaN()) == 100);
  CHECK(graph_runs_per_replay(std::numeric_limits<double>::infinity()) == 100);
  // Other targets and caps.
  CHECK(runs_filling(1e-3, 5e-3, 100) == 5);
  CHECK(runs_filling(1e-6, 1e-3, 8) == 8);
  CHECK(runs_filling(1e-6, 1e-3, 0) == 1);
  // As --timing queued sizes a batch: 0.1 s, at most 1000 runs.
  CHECK(runs_filling(110e-6, 0.1, 1000) == 910);  // a 15 us call behind a 95 us flush
  CHECK(runs_filling(2e-6, 0.1, 1000) == 1000);
  CHECK(runs_filling(0.3, 0.1, 1000) == 1);
}

namespace {

// One sample as CUPTI reports it, host window [1000, 2000] ns: the L2 flush queued before it (a
// memset, correlation 7), run()'s two kernels and a copy (calls 10, 11, 12; 11 is a runtime call
// with a nested driver call, 13, that queues nothing), an API call that queues nothing (14), and
// the clock probe launched after it (call 20). GPU timestamps are on their own clock.
std::vector<ActivityRecord> one_sample() {
  return {
      {Kind::api, 7, 900, 950},        // cudaMemsetAsync of the flush buffer
      {Kind::memset, 7, 50000, 58000},
      {Kind::api, 10, 1100, 1150},     // first kernel's launch
      {Kind::api, 11, 1200, 1260},     // second kernel's launch (runtime)
      {Kind::api, 13, 1210, 1250},     //   its driver call
      {Kind::api, 12, 1300, 1320},     // a device-to-device copy
      {Kind::api, 14, 1400, 1900},     // cudaDeviceSynchronize
      {Kind::kernel, 10, 60000, 61000},
      {Kind::kernel, 11, 61500, 64000},
      {Kind::memcpy, 12, 64100, 64600},
      {Kind::api, 20, 2100, 2150},     // the clock probe's launch
      {Kind::kernel, 20, 70000, 90000},
  };
}

}  // namespace

TEST_CASE("gpu_timing: a run's GPU time is the work its own API calls queued") {
  const RunGpuTime t = gpu_time_of_run(one_sample(), 1000, 2000);
  CHECK(t.device_records == 3);
  CHECK(t.untimed_records == 0);
  CHECK_THAT(t.busy_s, WithinAbs((1000 + 2500 + 500) * 1e-9, 1e-15));
  CHECK_THAT(t.span_s, WithinAbs((64600 - 60000) * 1e-9, 1e-15));  // counts the gaps too
}

TEST_CASE("gpu_timing: runs whose records are flushed together are told apart by their windows") {
  // --timing cupti reads a batch of samples' records at once: the second sample is the first
  // shifted by 5000 ns on the host, 100000 ns on the GPU, with a longer first kernel.
  std::vector<ActivityRecord> records = one_sample();
  for (ActivityRecord r : one_sample()) {
    r.correlation_id += 100;
    r.start_ns += r.kind == Kind::api ? 5000 : 100000;
    r.end_ns += r.kind == Kind::api ? 5000 : 100000;
    if (r.correlation_id == 110 && r.kind == Kind::kernel) r.end_ns += 700;
    records.push_back(r);
  }
  const RunGpuTime first = gpu_time_of_run(records, 1000, 2000);
  const RunGpuTime second = gpu_time_of_run(records, 6000, 7000);
  CHECK(first.device_records == 3);
  CHECK(second.device_records == 3);
  CHECK_THAT(first.busy_s, WithinAbs(4000e-9, 1e-15));
  // Its first kernel now runs into its second (60000-61700 against 61500-): 200 ns counted once.
  CHECK_THAT(second.busy_s, WithinAbs(4500e-9, 1e-15));
}

TEST_CASE("gpu_timing: kernels that overlap count their shared time once") {
  // A kernel launched to overlap the one before it starts during that one's last wave.
  const std::vector<ActivityRecord> records = {
      {Kind::api, 1, 100, 110},
      {Kind::api, 2, 120, 130},
      {Kind::api, 3, 140, 150},
      {Kind::kernel, 1, 10000, 12000},
      {Kind::kernel, 2, 11500, 14000},
      {Kind::kernel, 3, 12500, 13000},  // inside the second
  };
  const RunGpuTime t = gpu_time_of_run(records, 100, 200);
  CHECK(t.device_records == 3);
  CHECK_THAT(t.busy_s, WithinAbs(4000e-9, 1e-15));
  CHECK_THAT(t.span_s, WithinAbs(4000e-9, 1e-15));
}

TEST_CASE("gpu_timing: the flush before the window and the probe after it are left out") {
  // Attribution goes by the API call's host time, not by the GPU timestamps: a flush whose GPU
  // time falls among the run's kernels is still not the run's.
  std::vector<ActivityRecord> records = one_sample();
  records[1] = {Kind::memset, 7, 61100, 61400};
  const RunGpuTime t = gpu_time_of_run(records, 1000, 2000);
  CHECK(t.device_records == 3);
  CHECK_THAT(t.busy_s, WithinAbs(4000e-9, 1e-15));
  // A window around the probe's launch alone sees only the probe.
  const RunGpuTime probe = gpu_time_of_run(one_sample(), 2050, 3000);
  CHECK(probe.device_records == 1);
  CHECK_THAT(probe.busy_s, WithinAbs(20000e-9, 1e-15));
  // The window's edges are inside it.
  CHECK(gpu_time_of_run(one_sample(), 1100, 1100).device_records == 1);
}

TEST_CASE("gpu_timing: records without timestamps or without a call are not counted") {
  std::vector<ActivityRecord> records = one_sample();
  records.push_back({Kind::api, 15, 1500, 1510});
  records.push_back({Kind::kernel, 15, 0, 0});  // CUPTI could not time it
  records.push_back({Kind::kernel, 0, 60000, 70000});  // correlation 0 is no call
  records.push_back({Kind::api, 0, 1500, 1510});
  const RunGpuTime t = gpu_time_of_run(records, 1000, 2000);
  CHECK(t.device_records == 3);
  CHECK(t.untimed_records == 1);
  CHECK_THAT(t.busy_s, WithinAbs(4000e-9, 1e-15));
}

TEST_CASE("gpu_timing: a window with no work gives zero records") {
  const RunGpuTime none = gpu_time_of_run(one_sample(), 3000, 4000);
  CHECK(none.device_records == 0);
  CHECK(none.busy_s == 0.0);
  CHECK(none.span_s == 0.0);
  CHECK(gpu_time_of_run({}, 0, 100).device_records == 0);
  // Device records whose API records were never delivered cannot be attributed.
  CHECK(gpu_time_of_run({{Kind::kernel, 10, 1, 2}}, 0, 100).device_records == 0);
}
