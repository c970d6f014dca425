#include "replay/judge/run_comparison.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "formats/errors.h"
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
  figure.shared_from = text_at(kernel, "timing_shared_from");
  return figure;
}

std::optional<double> rel_l2(const nlohmann::json& kernel) {
  const auto error = kernel.find("error");
  if (error == kernel.end() || !error->is_object()) return std::nullopt;
  return optional_number_at(*error, "rel_l2");
}

// A call's kernel rows, in the record itself (json::value() would return a copy).
const nlohmann::json& kernels_of(const nlohmann::json& call) {
  static const nlohmann::json none = nlohmann::json::array();
  const auto found = call.find("kernels");
  return found != call.end() && found->is_array() ? *found : none;
}

bool ran(const std::string& status) { return status == "passed" || status == "not_verified"; }

void judge_speed(ComparedRow& row) {
  if (!row.base || !row.change) return;
  const TimedFigure &a = *row.base, &b = *row.change;
  row.ratio = b.median_s / a.median_s;
  // Beyond the noise of both runs: the medians' intervals apart, and the difference larger than
  // either run's spread of samples (a difference within a run's own spread is not told from chance
  // across runs, whose clocks and placement differ).
  const double half_width = std::max((a.high_s - a.low_s) / (2 * a.median_s), (b.high_s - b.low_s) / (2 * b.median_s));
  row.noise = std::max({a.spread_rel, b.spread_rel, half_width});
  const bool apart = b.low_s > a.high_s || b.high_s < a.low_s;
  if (!apart || std::abs(row.ratio - 1) <= row.noise) row.speed = SpeedVerdict::same;
  else row.speed = row.ratio > 1 ? SpeedVerdict::slower : SpeedVerdict::faster;
}

void judge_accuracy(ComparedRow& row) {
  if (row.base_rel_l2 && row.change_rel_l2) {
    const double before = *row.base_rel_l2, after = *row.change_rel_l2;
    row.less_accurate = std::isnan(after) ? !std::isnan(before)
                                          : after > before * (1 + kErrorGrowth) && after - before > kErrorFloor;
  }
  row.status_worse = ran(row.base_status) && !ran(row.change_status) && row.change_status != "not_supported";
}

ComparedRow compared_row(const std::string& label, const std::string& kernel, const nlohmann::json* before,
                         const nlohmann::json* after) {
  ComparedRow row;
  row.call = label;
  row.kernel = kernel;
  if (before) {
    row.base = timed_figure(*before);
    row.base_rel_l2 = rel_l2(*before);
    row.base_status = text_at(*before, "status");
  }
  if (after) {
    row.change = timed_figure(*after);
    row.change_rel_l2 = rel_l2(*after);
    row.change_status = text_at(*after, "status");
  }
  if (before && after) {
    judge_speed(row);
    judge_accuracy(row);
  }
  return row;
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
    if (!row.base_status.empty() && !row.change_status.empty()) {
      if (!by_kernel.count(row.kernel)) order.push_back(row.kernel);
      KernelComparison& k = by_kernel[row.kernel];
      k.kernel = row.kernel;
      ++k.calls;
      k.less_accurate += row.less_accurate;
      k.status_worse += row.status_worse;
      if (row.base_rel_l2 && !std::isnan(*row.base_rel_l2)) k.worst_base_rel_l2 = std::max(k.worst_base_rel_l2, *row.base_rel_l2);
      if (row.change_rel_l2) {
        k.worst_change_rel_l2 = std::isnan(*row.change_rel_l2) ? NAN : std::max(k.worst_change_rel_l2, *row.change_rel_l2);
      }
      // A timing that other calls share counts once, on the call it was measured on.
      const bool shared = (row.base && !row.base->shared_from.empty()) || (row.change && !row.change->shared_from.empty());
      if (row.speed != SpeedVerdict::untimed && !shared) {
        ++k.timed;
        log_sum[row.kernel] += std::log(row.ratio);
        if (row.speed == SpeedVerdict::faster) ++k.faster;
        if (row.speed == SpeedVerdict::slower) ++k.slower;
        if (row.speed == SpeedVerdict::same) ++k.same;
      }
    }
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

}  // namespace

const char* speed_verdict_name(SpeedVerdict verdict) {
  switch (verdict) {
    case SpeedVerdict::faster: return "faster";
    case SpeedVerdict::slower: return "slower";
    case SpeedVerdict::same: return "same";
    case SpeedVerdict::untimed: return "untimed";
  }
  return "?";
}

RunComparison compare_runs(const nlohmann::json& base, const std::string& base_name, const nlohmann::json& change,
                           const std::string& change_name) {
  const nlohmann::json& base_calls = calls_of(base, base_name);
  const nlohmann::json& change_calls = calls_of(change, change_name);
  RunComparison comparison;
  comparison.base_name = base_name;
  comparison.change_name = change_name;
  // The change's rows by (call, kernel); each is taken once, by the first base row that matches.
  std::map<std::pair<std::string, std::string>, std::pair<const nlohmann::json*, std::string>> unmatched;
  std::vector<std::pair<std::string, std::string>> change_order;
  for (const auto& call : change_calls) {
    for (const auto& kernel : kernels_of(call)) {
      const auto key = std::pair{call_key(call), text_at(kernel, "kernel")};
      if (unmatched.emplace(key, std::pair{&kernel, call_label(call)}).second) change_order.push_back(key);
    }
  }
  std::map<std::string, std::string> timed_apart;  // kernel -> how its two runs' headlines differ
  for (const auto& call : base_calls) {
    for (const auto& kernel : kernels_of(call)) {
      const std::string name = text_at(kernel, "kernel");
      const auto found = unmatched.find({call_key(call), name});
      const nlohmann::json* partner = found == unmatched.end() ? nullptr : found->second.first;
      if (partner && kernel.contains("timing") && partner->contains("timing") &&
          what_timed(kernel) != what_timed(*partner)) {
        timed_apart[name] = fmt::format("{}: the base timed the {}, the change the {}: its ratios compare two "
                                        "different things", name, what_timed(kernel) == "call" ? "whole call" : "kernel alone",
                                        what_timed(*partner) == "call" ? "whole call" : "kernel alone");
      }
      if (found != unmatched.end()) unmatched.erase(found);
      else ++comparison.only_in_base;
      comparison.rows.push_back(compared_row(call_label(call), name, &kernel, partner));
    }
  }
  for (const auto& key : change_order) {
    const auto found = unmatched.find(key);
    if (found == unmatched.end()) continue;
    ++comparison.only_in_change;
    comparison.rows.push_back(compared_row(found->second.second, key.second, nullptr, found->second.first));
  }
  comparison.differences = record_differences(base, change);
  for (const auto& [kernel, difference] : timed_apart) comparison.differences.push_back(difference);
  summarize(comparison);
  return comparison;
}

bool regresses(const ComparedRow& row, double percent) {
  const bool slower = row.speed == SpeedVerdict::slower && row.ratio > 1 + percent / 100;
  return slower || row.less_accurate || row.status_worse;
}

}  // namespace attnreplay
