#include "replay/report/comparison_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "replay/report/number_format.h"

namespace attnreplay {
namespace {

using Table = std::vector<std::vector<std::string>>;  // the header row first

// One format for a time ratio everywhere: "1.26x", "599x", "0.994x".
std::string ratio_text(double ratio) { return g(ratio, 3) + "x"; }

std::string milliseconds(const std::optional<TimedFigure>& figure) {
  return figure ? g(figure->median_s * 1e3, 4) : "-";
}

std::string error_change(const std::optional<double>& before, const std::optional<double>& after) {
  const auto text = [](const std::optional<double>& value) { return value ? g(*value, 3) : std::string("-"); };
  return text(before) + " -> " + text(after);
}

// What a row's reader should know first: the speed verdict, then what got worse.
std::string verdict(const ComparedRow& row, const ComparisonView& view) {
  std::vector<std::string> parts;
  if (row.base_status.empty()) parts.push_back("new row");
  else if (row.change_status.empty()) parts.push_back("gone");
  else if (row.speed != SpeedVerdict::untimed) parts.push_back(speed_verdict_name(row.speed));
  if (row.less_accurate) parts.push_back("LESS ACCURATE");
  if (row.status_worse) parts.push_back(fmt::format("{} -> {}", row.base_status, row.change_status));
  if (view.fail_percent >= 0 && regresses(row, view.fail_percent)) parts.push_back("REGRESSION");
  return parts.empty() ? "-" : fmt::format("{}", fmt::join(parts, ", "));
}

bool changed(const ComparedRow& row) {
  return row.speed == SpeedVerdict::faster || row.speed == SpeedVerdict::slower || row.less_accurate ||
         row.status_worse || row.base_status.empty() || row.change_status.empty();
}

Table kernel_table(const RunComparison& comparison) {
  Table table{{"kernel", "calls", "timed", "faster", "slower", "same", "noisy", "new/base", "worse",
               "worst rel_l2 base -> new"}};
  for (const KernelComparison& k : comparison.kernels) {
    table.push_back({k.kernel, std::to_string(k.calls), std::to_string(k.timed), std::to_string(k.faster),
                     std::to_string(k.slower), std::to_string(k.same), std::to_string(k.noisy),
                     k.timed ? ratio_text(k.geomean_ratio) : "-",
                     std::to_string(k.less_accurate + k.status_worse),
                     error_change(k.worst_base_rel_l2, k.worst_change_rel_l2)});
  }
  return table;
}

// The rows to list: those that changed (all with -v), slowest and least accurate first.
std::vector<const ComparedRow*> listed_rows(const RunComparison& comparison, const ComparisonView& view,
                                            std::size_t& left_out) {
  std::vector<const ComparedRow*> rows;
  for (const ComparedRow& row : comparison.rows) {
    if (view.every_row || changed(row)) rows.push_back(&row);
  }
  if (!view.every_row) {
    std::stable_sort(rows.begin(), rows.end(), [](const ComparedRow* a, const ComparedRow* b) {
      const auto rank = [](const ComparedRow* r) { return r->status_worse || r->less_accurate ? 2.0 + r->ratio : r->ratio; };
      return rank(a) > rank(b);
    });
  }
  left_out = !view.every_row && rows.size() > view.row_limit ? rows.size() - view.row_limit : 0;
  rows.resize(rows.size() - left_out);
  return rows;
}

// Rounded down: a noise of 2.96 % shown as "3.0" beside a 3 % minimum would read as judged against
// the rule, when the verdict used the noise as measured.
std::string noise_text(double noise) { return fmt::format("{:.1f}", std::floor(noise * 1000) / 10); }

Table row_table(const std::vector<const ComparedRow*>& rows, const ComparisonView& view) {
  Table table{{"call", "kernel", "base ms", "new ms", "new/base", "noise %", "rel_l2 base -> new", "verdict"}};
  for (const ComparedRow* row : rows) {
    const std::string call =
        row->calls > 1 ? fmt::format("{} (+{} sharing its timing)", row->call, row->calls - 1) : row->call;
    table.push_back({call, row->kernel, milliseconds(row->base), milliseconds(row->change),
                     row->ratio > 0 ? ratio_text(row->ratio) : "-",
                     row->ratio > 0 ? noise_text(row->noise) : "-",
                     error_change(row->base_rel_l2, row->change_rel_l2), verdict(*row, view)});
  }
  return table;
}

std::string text_table(const Table& table) {
  std::vector<std::size_t> widths(table.front().size(), 0);
  for (const auto& row : table) {
    for (std::size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string out;
  for (const auto& row : table) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      // Names left, figures right.
      line += c == 0 || (c == 1 && table.front()[1] == "kernel") ? fmt::format("{:<{}}", row[c], widths[c])
                                                                 : fmt::format("{:>{}}", row[c], widths[c]);
      if (c + 1 < row.size()) line += "  ";
    }
    out += line + "\n";
  }
  return out;
}

std::string markdown_table(const Table& table) {
  std::string out;
  for (std::size_t r = 0; r < table.size(); ++r) {
    out += "| " + fmt::format("{}", fmt::join(table[r], " | ")) + " |\n";
    if (r == 0) {
      std::string rule = "|";
      for (std::size_t c = 0; c < table[r].size(); ++c) rule += c < 2 ? " --- |" : " ---: |";
      out += rule + "\n";
    }
  }
  return out;
}

std::string unpaired(const RunComparison& comparison) {
  if (!comparison.only_in_base && !comparison.only_in_change) return {};
  return fmt::format("{} (call, kernel) rows only in {}, {} only in {}\n", comparison.only_in_base,
                     comparison.base_name, comparison.only_in_change, comparison.change_name);
}

int regressions(const RunComparison& comparison, const ComparisonView& view) {
  if (view.fail_percent < 0) return 0;
  return static_cast<int>(std::count_if(comparison.rows.begin(), comparison.rows.end(),
                                        [&](const ComparedRow& row) { return regresses(row, view.fail_percent); }));
}

// How many timed rows were too noisy to judge, and what to do about it; empty when none.
std::string noisy_rows(const RunComparison& comparison) {
  const auto noisy = std::count_if(comparison.rows.begin(), comparison.rows.end(),
                                   [](const ComparedRow& row) { return row.speed == SpeedVerdict::noisy; });
  if (noisy == 0) return {};
  return fmt::format("{} row{} too noisy to judge (noise at or above the {}% minimum difference): neither faster nor "
                     "slower, whatever the ratio; time both on a quiet machine (-v lists them)\n",
                     noisy, noisy == 1 ? "" : "s", g(comparison.threshold * 100, 3));
}

}  // namespace

std::string comparison_text(const RunComparison& comparison, const ComparisonView& view) {
  std::string out = fmt::format("base: {}\nnew:  {}\n", comparison.base_name, comparison.change_name);
  for (const std::string& difference : comparison.differences) out += "the runs differ, " + difference + "\n";
  out += fmt::format("\nper kernel (new/base: geometric mean of the time ratios of the timings in both runs;\n"
                     "faster or slower only beyond both runs' noise and by over {}%; noisy: a run's noise reaches that;\n"
                     "worse: less accurate, or failing where it ran)\n", g(comparison.threshold * 100, 3));
  out += text_table(kernel_table(comparison));
  std::size_t left_out = 0;
  const auto rows = listed_rows(comparison, view, left_out);
  out += fmt::format("\n{} ({} listed)\n", view.every_row ? "every row" : "rows that changed", rows.size());
  if (!rows.empty()) out += text_table(row_table(rows, view));
  if (left_out) out += fmt::format("... and {} more (-v lists every row)\n", left_out);
  out += noisy_rows(comparison);
  out += unpaired(comparison);
  if (view.fail_percent >= 0) {
    out += fmt::format("{} regression{} (slower by over {}% beyond the noise, less accurate, or failing)\n",
                       regressions(comparison, view), regressions(comparison, view) == 1 ? "" : "s", view.fail_percent);
  }
  return out;
}

std::string comparison_markdown(const RunComparison& comparison, const ComparisonView& view) {
  std::string out = fmt::format("### attnreplay compare: `{}` -> `{}`\n\n", comparison.base_name, comparison.change_name);
  for (const std::string& difference : comparison.differences) out += "- the runs differ, " + difference + "\n";
  if (!comparison.differences.empty()) out += "\n";
  out += markdown_table(kernel_table(comparison));
  out += fmt::format("\nTime new/base: geometric mean over the timings in both runs; a row is faster or slower only "
                     "beyond the noise of both runs and by over {}%, and too noisy to judge where a run's noise "
                     "reaches that; worse: less accurate or failing.\n", g(comparison.threshold * 100, 3));
  std::size_t left_out = 0;
  const auto rows = listed_rows(comparison, view, left_out);
  if (!rows.empty()) out += "\n" + markdown_table(row_table(rows, view));
  if (left_out) out += fmt::format("\n... and {} more rows (`-v` lists every row)\n", left_out);
  if (const std::string text = noisy_rows(comparison); !text.empty()) out += "\n" + text;
  if (const std::string text = unpaired(comparison); !text.empty()) out += "\n" + text;
  if (view.fail_percent >= 0) out += fmt::format("\n**{} regressions**\n", regressions(comparison, view));
  return out;
}

}  // namespace attnreplay
