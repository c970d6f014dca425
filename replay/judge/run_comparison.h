#pragma once
// Two runs' records side by side (`attnreplay compare BASE.json NEW.json`): each (call, kernel)
// of both, its time ratio with a verdict that says faster or slower only beyond the noise of both
// runs (as nvbench_compare does), and whether its error or status got worse; per kernel, the
// geometric mean of the ratios; and what differs between the runs' machines.
#include <nlohmann/json_fwd.hpp>

#include <optional>
#include <string>
#include <vector>

namespace attnreplay {

enum class SpeedVerdict {
  faster,
  slower,
  same,     // within the noise of both runs
  untimed,  // timed in one run only, or in neither
};
const char* speed_verdict_name(SpeedVerdict verdict);

struct TimedFigure {
  double median_s = 0;
  double low_s = 0, high_s = 0;  // the median's 95 % interval; the median where not known
  double spread_rel = 0;         // the samples' robust relative spread
  std::string shared_from;       // the call whose timing this row reuses, if any
};

struct ComparedRow {
  std::string call;  // "cap.h5 call 3 [tag]"
  std::string kernel;
  std::optional<TimedFigure> base, change;
  std::optional<double> base_rel_l2, change_rel_l2;
  std::string base_status, change_status;
  SpeedVerdict speed = SpeedVerdict::untimed;
  double ratio = 0;    // change's median over base's (below 1: faster); 0 when untimed
  double noise = 0;    // the relative difference the verdict needed to say faster or slower
  bool less_accurate = false;
  bool status_worse = false;  // ran before, failed or incorrect now
};

struct KernelComparison {
  std::string kernel;
  int calls = 0;                       // paired calls
  int timed = 0;                       // ratios (shared timings counted once)
  int faster = 0, slower = 0, same = 0;
  double geomean_ratio = 0;            // over the timed ratios; 0 when none
  int less_accurate = 0, status_worse = 0;
  double worst_base_rel_l2 = 0, worst_change_rel_l2 = 0;
};

struct RunComparison {
  std::string base_name, change_name;
  std::vector<ComparedRow> rows;  // in base's order, then rows only the change has
  std::vector<KernelComparison> kernels;
  int only_in_base = 0, only_in_change = 0;  // (call, kernel) rows without a partner
  // "GPU: NVIDIA H100 vs NVIDIA H200", clocks, torch, attnreplay: why ratios may not be the code's.
  std::vector<std::string> differences;
};

// Pairs rows by capture file name, call index, case tag, shape and kernel. Throws InputError,
// naming the file, on a record that is not a run's.
RunComparison compare_runs(const nlohmann::json& base, const std::string& base_name, const nlohmann::json& change,
                           const std::string& change_name);

// A row that regresses: slower beyond the noise and by more than `percent`, less accurate, or
// failing where it ran.
bool regresses(const ComparedRow& row, double percent);

}  // namespace attnreplay
