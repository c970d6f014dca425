#pragma once
// What the GPU timers decide, as plain functions over plain values, so that it is built and unit
// tested where there is no GPU: the throttle guard, how many runs one CUDA-graph replay (or queued
// batch) holds, and which CUPTI activity records belong to one run.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace attnreplay {

// nvbench's throttle guard: a sample taken while the SM clock ran under `threshold` of the rated
// clock is discarded. Without a rated clock, the highest clock seen so far stands in for it; a
// sample whose clock could not be measured (0) is kept.
class ThrottleGuard {
 public:
  ThrottleGuard(double rated_mhz, double threshold) : rated_mhz_(rated_mhz), threshold_(threshold) {}
  bool accept(double sm_mhz);

 private:
  double rated_mhz_;
  double threshold_;
  double max_seen_mhz_ = 0;
};

// Runs that together last about `target_s`, `single_run_s` each, between 1 and `max_runs` (the
// most where the estimate failed). --timing graph captures that many into one graph, enough that a
// replay's launch and events are small beside it (1 ms, 100); --timing queued queues that many
// before it waits, as do_bench queues its 100 ms (0.1 s of run and flush, 1000).
int runs_filling(double single_run_s, double target_s, int max_runs);

// One CUPTI activity record, reduced to what attribution needs. API records (runtime or driver
// calls) carry host timestamps; device records (kernels, copies, sets) carry GPU ones. Both carry
// the correlation id of the API call that queued the work.
struct ActivityRecord {
  enum class Kind { api, kernel, memcpy, memset };
  Kind kind = Kind::kernel;
  std::uint32_t correlation_id = 0;
  std::uint64_t start_ns = 0;
  std::uint64_t end_ns = 0;
};

struct RunGpuTime {
  double busy_s = 0;  // the union of the device records' intervals: the GPU busy time of the run
                      // (kernels launched to overlap the one before count their shared time once)
  double span_s = 0;  // first start to last end (FlashInfer's figure; it counts the gaps too)
  int device_records = 0;  // timed ones, in the figures
  int untimed_records = 0;  // of the run, but without timestamps: the figures miss them
};

// The GPU time of the work queued by API calls that started within [begin_ns, end_ns] (host
// timestamps taken around one run). Work queued before (the L2 flush) or after (the clock probe)
// is left out by its correlation id, whatever its GPU timestamps, as FlashInfer attributes it.
RunGpuTime gpu_time_of_run(const std::vector<ActivityRecord>& records, std::uint64_t begin_ns, std::uint64_t end_ns);

}  // namespace attnreplay
