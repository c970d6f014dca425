#include "replay/judge/run_comparison.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <tuple>

#include "formats/errors.h"
#include "replay/judge/distribution.h"
#include "replay/report/json_values.h"

namespace attnreplay {
namespace {

// A relative error that grew by more than this, and by more than kErrorFloor, is "less accurate":
// a kernel's error on the same inputs repeats to the last digit unless it sums in a varying order.
constexpr double kErrorGrowth = 0.10;
constexpr double kErrorFloor = 1e-6;
// Median SM clocks further apart than this make the runs' ratios the clocks' as much as the code's.
constexpr double kClockDifference = 0.03;

// The call as both runs name it: the capture's file name (runs may read it from different
// folders), its index, its tag and its shape.
std::string call_key(const nlohmann::json& call) {
  std::string key = fmt::format("{}#{}#{}", std::filesystem::path(text_at(call, "source")).filename().string(),
                                call.value("call_index", -1), text_at(call, "case_tag"));
  if (const auto shape = call.find("shape"); shape != call.end()) key += "#" + shape->dump();
  return key + "#" + text_at(call, "dtype");
}

std::string call_label(const nlohmann::json& call) {
  std::string label = fmt::format("{} call {}", std::filesystem::path(text_at(call, "source")).filename().string(),
                                  call.value("call_index", -1));
  if (const std::string tag = text_at(call, "case_tag"); !tag.empty()) label += " [" + tag + "]";
  return label;
}

// One run's timing of a row; nullopt where it was not timed.
std::optional<TimedFigure> timed_figure(const nlohmann::json& kernel) {
  const auto timing = kernel.find("timing");
  if (timing == kernel.end() || !timing->is_object()) return std::nullopt;
  const auto median = optional_number_at(*timing, "median_s");
  if (!median || *median <= 0) return std::nullopt;
  TimedFigure figure;
  figure.median_s = *median;
  figure.low_s = optional_number_at(*timing, "median_ci_low_s").value_or(*median);
  figure.high_s = optional_number_at(*timing, "median_ci_high_s").value_or(*median);
  figure.spread_rel = optional_number_at(*timing, "spread_rel").value_or(0);
  return figure;
}

// Repeated runs' timings of a row as one: the median of their medians, the interval spanning
// theirs, the largest in-run spread, and how far apart the runs' medians are.
std::optional<TimedFigure> timed_figure(const std::vector<const nlohmann::json*>& runs) {
  std::vector<TimedFigure> figures;
  for (const nlohmann::json* kernel : runs) {
    if (auto figure = timed_figure(*kernel)) figures.push_back(*figure);
  }
  if (figures.empty()) return std::nullopt;
  if (figures.size() == 1) return figures.front();
  std::vector<double> medians;
  TimedFigure joined;
  joined.low_s = figures.front().low_s, joined.high_s = figures.front().high_s;
  for (const TimedFigure& f : figures) {
    medians.push_back(f.median_s);
    joined.low_s = std::min(joined.low_s, f.low_s), joined.high_s = std::max(joined.high_s, f.high_s);
    joined.spread_rel = std::max(joined.spread_rel, f.spread_rel);
  }
  std::sort(medians.begin(), medians.end());
  joined.median_s = percentile(medians, 0.5);
  joined.between_runs_rel = (medians.back() - medians.front()) / joined.median_s;
  joined.runs = static_cast<int>(medians.size());
  return joined;
}

std::optional<double> rel_l2(const nlohmann::json& kernel) {
  const auto error = kernel.find("error");
  if (error == kernel.end() || !error->is_object()) return std::nullopt;
  return optional_number_at(judged_figures(*error), "rel_l2");
}

// The larger of two errors, NaN (a reference or output that is not finite) standing over any.
std::optional<double> worse_error(const std::optional<double>& a, const std::optional<double>& b) {
  if (!a || !b) return a ? a : b;
  if (std::isnan(*a) || std::isnan(*b)) return NAN;
  return std::max(*a, *b);
}

// A call's kernel rows, in the record itself (json::value() would return a copy).
const nlohmann::json& kernels_of(const nlohmann::json& call) {
  static const nlohmann::json none = nlohmann::json::array();
  const auto found = call.find("kernels");
  return found != call.end() && found->is_array() ? *found : none;
}

bool ran(const std::string& status) { return status == "passed" || status == "not_verified"; }

// Faster or slower only with the medians' intervals apart and the difference beyond the minimum,
// where the noise is below it. A noise at or above the minimum cannot tell a change of that size
// from the machine: two runs of the same kernels under a concurrent load on two cores read 30-76 %
// apart at a spread of 6-8 %, so no multiple of a run's own spread bounds what the next run does.
void judge_speed(ComparedRow& row, double threshold) {
  if (!row.base || !row.change) return;
  const TimedFigure &a = *row.base, &b = *row.change;
  row.ratio = b.median_s / a.median_s;
  const double half_width = std::max((a.high_s - a.low_s) / (2 * a.median_s), (b.high_s - b.low_s) / (2 * b.median_s));
  row.noise = std::max({a.spread_rel, b.spread_rel, half_width, a.between_runs_rel, b.between_runs_rel});
  const bool apart = b.low_s > a.high_s || b.high_s < a.low_s;
  if (row.noise >= threshold) row.speed = SpeedVerdict::noisy;
  else if (apart && std::abs(row.ratio - 1) > threshold) row.speed = row.ratio > 1 ? SpeedVerdict::slower : SpeedVerdict::faster;
  else row.speed = SpeedVerdict::same;
}

bool less_accurate(const std::optional<double>& before_error, const std::optional<double>& after_error) {
  if (!before_error || !after_error) return false;
  const double before = *before_error, after = *after_error;
  return std::isnan(after) ? !std::isnan(before) : after > before * (1 + kErrorGrowth) && after - before > kErrorFloor;
}

bool status_worse(const std::string& before, const std::string& after) {
  return ran(before) && !ran(after) && after != "not_supported";
}

// One (call, kernel) of one side: its row in each of the side's records.
struct SideRow {
  std::string label;           // "cap.h5 call 3 [tag]"
  std::string timing_source;   // the call whose timing this row has: its own, or the one it shares
  std::vector<const nlohmann::json*> runs;
};

using RowKey = std::pair<std::string, std::string>;  // (call_key, kernel)

// A side's rows by (call, kernel), in its first record's order; the other records add their runs.
struct SideRows {
  std::map<RowKey, SideRow> rows;
  std::vector<RowKey> order;
};

std::string timing_source(const nlohmann::json& call, const nlohmann::json& kernel) {
  const std::string shared = text_at(kernel, "timing_shared_from");
  // As AttentionCall::where() names the call a shared timing came from.
  return shared.empty() ? fmt::format("{}: call {}", text_at(call, "source"), call.value("call_index", -1)) : shared;
}

const nlohmann::json& calls_of(const nlohmann::json& record, const std::string& name) {
  const auto calls = record.find("calls");
  if (!record.is_object() || calls == record.end() || !calls->is_array()) {
    throw InputError(fmt::format("{}: not a run's record (no \"calls\" list): give the --json of attnreplay run", name));
  }
  return *calls;
}

// What differs between the machines and builds that made the records.
std::vector<std::string> record_differences(const nlohmann::json& base, const nlohmann::json& change) {
  std::vector<std::string> out;
  const nlohmann::json empty = nlohmann::json::object();
  const nlohmann::json& a = base.contains("environment") ? base["environment"] : empty;
  const nlohmann::json& b = change.contains("environment") ? change["environment"] : empty;
  for (const auto& [key, label] : {std::pair{"gpu", "GPU"}, {"cpu", "CPU"}, {"torch", "torch"}, {"os", "OS"}}) {
    const std::string x = text_at(a, key), y = text_at(b, key);
    if (x != y) out.push_back(fmt::format("{}: {} vs {}", label, x.empty() ? "-" : x, y.empty() ? "-" : y));
  }
  if (text_at(base, "tool_version") != text_at(change, "tool_version")) {
    out.push_back(fmt::format("attnreplay: {} vs {}", text_at(base, "tool_version"), text_at(change, "tool_version")));
  }
  const auto median_clock = [](const nlohmann::json& record) {
    std::vector<double> clocks;
    for (const auto& call : record["calls"]) {
      for (const auto& kernel : kernels_of(call)) {
        if (!kernel.contains("timing") || !kernel["timing"].is_object()) continue;
        if (const auto mhz = optional_number_at(kernel["timing"], "sm_clock_median_mhz"); mhz && *mhz > 0) clocks.push_back(*mhz);
      }
    }
    if (clocks.empty()) return 0.0;
    std::nth_element(clocks.begin(), clocks.begin() + static_cast<std::ptrdiff_t>(clocks.size() / 2), clocks.end());
    return clocks[clocks.size() / 2];
  };
  const double x = median_clock(base), y = median_clock(change);
  if (x > 0 && y > 0 && std::abs(y / x - 1) > kClockDifference) {
    out.push_back(fmt::format("median SM clock while timing: {:.0f} vs {:.0f} MHz", x, y));
  }
  return out;
}

void summarize(RunComparison& comparison) {
  std::map<std::string, KernelComparison> by_kernel;
  std::vector<std::string> order;
  std::map<std::string, double> log_sum;
  for (const ComparedRow& row : comparison.rows) {
    if (row.base_status.empty() || row.change_status.empty()) continue;
    if (!by_kernel.count(row.kernel)) order.push_back(row.kernel);
    KernelComparison& k = by_kernel[row.kernel];
    k.kernel = row.kernel;
    k.calls += row.calls;
    k.less_accurate += row.less_accurate;
    k.status_worse += row.status_worse;
    if (row.base_rel_l2 && !std::isnan(*row.base_rel_l2)) k.worst_base_rel_l2 = std::max(k.worst_base_rel_l2, *row.base_rel_l2);
    if (row.change_rel_l2) {
      k.worst_change_rel_l2 = std::isnan(*row.change_rel_l2) ? NAN : std::max(k.worst_change_rel_l2, *row.change_rel_l2);
    }
    // A row is one timing, whatever the calls that share it.
    if (row.speed == SpeedVerdict::untimed) continue;
    ++k.timed;
    log_sum[row.kernel] += std::log(row.ratio);
    k.faster += row.speed == SpeedVerdict::faster;
    k.slower += row.speed == SpeedVerdict::slower;
    k.same += row.speed == SpeedVerdict::same;
    k.noisy += row.speed == SpeedVerdict::noisy;
  }
  for (const std::string& kernel : order) {
    KernelComparison k = by_kernel[kernel];
    if (k.timed > 0) k.geomean_ratio = std::exp(log_sum[kernel] / k.timed);
    comparison.kernels.push_back(k);
  }
}

// What a row's headline time covers (`timed`); records written before the field had it as the
// kernel alone wherever the whole call was timed apart.
std::string what_timed(const nlohmann::json& kernel) {
  const std::string timed = text_at(kernel, "timed");
  if (!timed.empty()) return timed;
  return kernel.contains("timing_with_preparation") ? "kernel" : "call";
}

SideRows side_rows(const ComparedRuns& side) {
  if (side.records.empty()) throw InputError(fmt::format("{}: no record", side.name));
  SideRows out;
  for (const nlohmann::json& record : side.records) {
    const bool first = &record == &side.records.front();
    for (const auto& call : calls_of(record, side.name)) {
      for (const auto& kernel : kernels_of(call)) {
        const RowKey key{call_key(call), text_at(kernel, "kernel")};
        auto found = out.rows.find(key);
        if (found == out.rows.end()) {
          // A row that only a later run has is left out: the runs are of one replay.
          if (!first) continue;
          found = out.rows.emplace(key, SideRow{call_label(call), timing_source(call, kernel), {}}).first;
          out.order.push_back(key);
        } else if (first) {
          continue;  // the same (call, kernel) twice in one record: the first stands
        }
        found->second.runs.push_back(&kernel);
      }
    }
  }
  return out;
}

// The row for one (call, kernel) of either side or both.
ComparedRow compared_row(const std::string& kernel, const SideRow* before, const SideRow* after, double threshold) {
  ComparedRow row;
  row.call = before ? before->label : after->label;
  row.kernel = kernel;
  if (before) {
    row.base = timed_figure(before->runs);
    for (const nlohmann::json* run : before->runs) row.base_rel_l2 = worse_error(row.base_rel_l2, rel_l2(*run));
    row.base_status = text_at(*before->runs.front(), "status");
  }
  if (after) {
    row.change = timed_figure(after->runs);
    for (const nlohmann::json* run : after->runs) row.change_rel_l2 = worse_error(row.change_rel_l2, rel_l2(*run));
    row.change_status = text_at(*after->runs.front(), "status");
  }
  if (before && after) {
    judge_speed(row, threshold);
    row.less_accurate = less_accurate(row.base_rel_l2, row.change_rel_l2);
    row.status_worse = status_worse(row.base_status, row.change_status);
  }
  return row;
}

// `row` folded into the row of the calls that share its timing: one timing, their count, the worst
// of their errors and whatever got worse on any of them.
void fold_into(ComparedRow& group, const ComparedRow& row) {
  ++group.calls;
  group.base_rel_l2 = worse_error(group.base_rel_l2, row.base_rel_l2);
  group.change_rel_l2 = worse_error(group.change_rel_l2, row.change_rel_l2);
  group.less_accurate = group.less_accurate || row.less_accurate;
  // The statuses shown are those of a call that got worse, where one did.
  if (row.status_worse && !group.status_worse) group.base_status = row.base_status, group.change_status = row.change_status;
  group.status_worse = group.status_worse || row.status_worse;
}

}  // namespace

const char* speed_verdict_name(SpeedVerdict verdict) {
  switch (verdict) {
    case SpeedVerdict::faster: return "faster";
    case SpeedVerdict::slower: return "slower";
    case SpeedVerdict::same: return "same";
    case SpeedVerdict::noisy: return "too noisy to judge";
    case SpeedVerdict::untimed: return "untimed";
  }
  return "?";
}

RunComparison compare_runs(const ComparedRuns& base, const ComparedRuns& change, double threshold) {
  const SideRows before = side_rows(base), after = side_rows(change);
  RunComparison comparison;
  comparison.base_name = base.name;
  comparison.change_name = change.name;
  comparison.threshold = threshold;
  // Rows in base's order, then the change's own; calls sharing one timing in both runs fold into
  // the row of the first of them.
  std::map<std::tuple<std::string, std::string, std::string>, std::size_t> groups;
  std::map<std::string, std::string> timed_apart;  // kernel -> how its two runs' headlines differ
  const auto add = [&](const RowKey& key, const SideRow* a, const SideRow* b) {
    ComparedRow row = compared_row(key.second, a, b, threshold);
    const auto group_key = std::tuple{key.second, a ? a->timing_source : "", b ? b->timing_source : ""};
    const bool timed_in_both = row.base && row.change;
    if (const auto found = groups.find(group_key); timed_in_both && found != groups.end()) {
      fold_into(comparison.rows[found->second], row);
      return;
    }
    if (timed_in_both) groups[group_key] = comparison.rows.size();
    comparison.rows.push_back(std::move(row));
  };
  for (const RowKey& key : before.order) {
    const SideRow& a = before.rows.at(key);
    const auto partner = after.rows.find(key);
    const SideRow* b = partner == after.rows.end() ? nullptr : &partner->second;
    if (b && a.runs.front()->contains("timing") && b->runs.front()->contains("timing") &&
        what_timed(*a.runs.front()) != what_timed(*b->runs.front())) {
      const std::string name = key.second;
      timed_apart[name] = fmt::format("{}: the base timed the {}, the change the {}: its ratios compare two "
                                      "different things", name,
                                      what_timed(*a.runs.front()) == "call" ? "whole call" : "kernel alone",
                                      what_timed(*b->runs.front()) == "call" ? "whole call" : "kernel alone");
    }
    if (!b) ++comparison.only_in_base;
    add(key, &a, b);
  }
  for (const RowKey& key : after.order) {
    if (before.rows.count(key)) continue;
    ++comparison.only_in_change;
    add(key, nullptr, &after.rows.at(key));
  }
  comparison.differences = record_differences(base.records.front(), change.records.front());
  for (const auto& [kernel, difference] : timed_apart) comparison.differences.push_back(difference);
  summarize(comparison);
  return comparison;
}

RunComparison compare_runs(const nlohmann::json& base, const std::string& base_name, const nlohmann::json& change,
                           const std::string& change_name, double threshold) {
  return compare_runs(ComparedRuns{base_name, {base}}, ComparedRuns{change_name, {change}}, threshold);
}

bool regresses(const ComparedRow& row, double percent) {
  const bool slower = row.speed == SpeedVerdict::slower && row.ratio > 1 + percent / 100;
  return slower || row.less_accurate || row.status_worse;
}

}  // namespace attnreplay
