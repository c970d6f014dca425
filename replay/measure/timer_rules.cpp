#include "replay/measure/timer_rules.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>
#include <utility>
#include <vector>

namespace attnreplay {

bool ThrottleGuard::accept(double sm_mhz) {
  max_seen_mhz_ = std::max(max_seen_mhz_, sm_mhz);
  const double rated = rated_mhz_ > 0 ? rated_mhz_ : max_seen_mhz_;
  return !(sm_mhz > 0 && sm_mhz < threshold_ * rated);
}

int runs_filling(double single_run_s, double target_s, int max_runs) {
  max_runs = std::max(max_runs, 1);
  // A run too short to measure (or a failed estimate) gets the most runs, which is always safe.
  if (!(single_run_s > 0) || !std::isfinite(single_run_s)) return max_runs;
  const double runs = std::ceil(target_s / single_run_s);
  if (!(runs < max_runs)) return max_runs;
  return std::max(1, static_cast<int>(runs));
}

RunGpuTime gpu_time_of_run(const std::vector<ActivityRecord>& records, std::uint64_t begin_ns, std::uint64_t end_ns) {
  std::unordered_set<std::uint32_t> calls;
  for (const ActivityRecord& r : records) {
    // Id 0 is no call: CUPTI gives it to records it could not attribute.
    if (r.kind == ActivityRecord::Kind::api && r.correlation_id != 0 && r.start_ns >= begin_ns && r.start_ns <= end_ns) {
      calls.insert(r.correlation_id);
    }
  }
  RunGpuTime time;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> intervals;
  for (const ActivityRecord& r : records) {
    if (r.kind == ActivityRecord::Kind::api || !calls.count(r.correlation_id)) continue;
    // Start and end both 0: CUPTI could not time it.
    if (r.end_ns < r.start_ns || (r.start_ns == 0 && r.end_ns == 0)) {
      ++time.untimed_records;
      continue;
    }
    intervals.emplace_back(r.start_ns, r.end_ns);
    ++time.device_records;
  }
  if (intervals.empty()) return time;
  std::sort(intervals.begin(), intervals.end());
  std::uint64_t busy_ns = 0, covered_to = intervals.front().first;
  for (const auto& [start, end] : intervals) {
    if (end <= covered_to) continue;
    busy_ns += end - std::max(start, covered_to);
    covered_to = end;
  }
  time.busy_s = static_cast<double>(busy_ns) * 1e-9;
  time.span_s = static_cast<double>(covered_to - intervals.front().first) * 1e-9;
  return time;
}

}  // namespace attnreplay
