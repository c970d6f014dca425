#pragma once
// Two runs' records side by side (`attnreplay compare BASE.json NEW.json`): each (call, kernel)
// of both, its time ratio with a verdict that says faster or slower only beyond the noise of both
// runs and beyond a minimum difference (as nvbench_compare does: runs differ from each other by
// more than a run's own samples do), and whether its error or status got worse; per kernel, the
// geometric mean of the ratios; and what differs between the runs' machines. Calls that share one
// timing are one row.
#include <nlohmann/json_fwd.hpp>

#include <optional>
#include <string>
#include <vector>

namespace attnreplay {

enum class SpeedVerdict {
  faster,
  slower,
  same,     // within the noise of both runs and the minimum difference
  noisy,    // a run's noise is at or above the minimum difference: a change that size is not told from it
  untimed,  // timed in one run only, or in neither
};
const char* speed_verdict_name(SpeedVerdict verdict);

// A row's timing in one side: one run's, or the median of repeated runs'.
struct TimedFigure {
  double median_s = 0;
  double low_s = 0, high_s = 0;  // the median's 95 % interval; the median where not known
  double spread_rel = 0;         // the samples' robust relative spread (the largest of the runs')
  double between_runs_rel = 0;   // repeated runs: their medians' range over their median
  int runs = 1;
};

struct ComparedRow {
  std::string call;  // "cap.h5 call 3 [tag]": the call timed, where calls share its timing
  int calls = 1;     // the calls this row stands for (those sharing its timing)
  std::string kernel;
  std::optional<TimedFigure> base, change;
  std::optional<double> base_rel_l2, change_rel_l2;  // the worst of the row's calls
  std::string base_status, change_status;
  SpeedVerdict speed = SpeedVerdict::untimed;
  double ratio = 0;    // change's median over base's (below 1: faster); 0 when untimed
  double noise = 0;    // the relative difference the runs' noise alone can make
  bool less_accurate = false;  // on any of the row's calls
  bool status_worse = false;   // ran before, failed or incorrect now, on any of its calls
};

struct KernelComparison {
  std::string kernel;
  int calls = 0;                       // paired calls
  int timed = 0;                       // ratios (shared timings counted once)
  int faster = 0, slower = 0, same = 0, noisy = 0;
  double geomean_ratio = 0;            // over the timed ratios; 0 when none
  int less_accurate = 0, status_worse = 0;
  double worst_base_rel_l2 = 0, worst_change_rel_l2 = 0;
};

// One side of a comparison: a run's record, or those of repeated runs of the same replay.
struct ComparedRuns {
  std::string name;
  std::vector<nlohmann::json> records;
};

struct RunComparison {
  std::string base_name, change_name;
  double threshold = 0;           // the minimum relative difference a verdict needs
  std::vector<ComparedRow> rows;  // in base's order, then rows only the change has
  std::vector<KernelComparison> kernels;
  int only_in_base = 0, only_in_change = 0;  // (call, kernel) rows without a partner
  // "GPU: NVIDIA H100 vs NVIDIA H200", clocks, torch, attnreplay: why ratios may not be the code's.
  std::vector<std::string> differences;
};

inline constexpr double kDefaultThresholdDiff = 0.03;

// Pairs rows by capture file name, call index, case tag, shape and kernel; `threshold` is the
// minimum relative difference (0.03: 3 %). Throws InputError, naming the file, on a record that is
// not a run's.
RunComparison compare_runs(const ComparedRuns& base, const ComparedRuns& change,
                           double threshold = kDefaultThresholdDiff);
RunComparison compare_runs(const nlohmann::json& base, const std::string& base_name, const nlohmann::json& change,
                           const std::string& change_name, double threshold = kDefaultThresholdDiff);

// A row that regresses: slower beyond the noise and by more than `percent`, less accurate, or
// failing where it ran. A row too noisy to judge never regresses for its speed.
bool regresses(const ComparedRow& row, double percent);

}  // namespace attnreplay
