#include "replay/report/run_summary.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <map>
#include <vector>

#include "replay/judge/kernel_summary.h"
#include "replay/report/number_format.h"
#include "replay/report/text_wrap.h"

namespace attnreplay {
namespace {

// `text` in lines of at most 116 characters after a two-space indent (six on the lines after the
// first), broken at spaces.
std::string wrapped(const std::string& text) {
  std::vector<std::string> words;
  for (std::size_t start = 0; start < text.size();) {
    std::size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    words.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return wrap_fields(words, "  ", "      ", " ", 116);
}

}  // namespace

std::string run_summary_text(const nlohmann::json& record, const std::string& baseline) {
  if (record.at("calls").empty()) return {};
  const KernelSummary summary = summarize_kernels(record, baseline);
  std::string out = fmt::format("\nsummary over {} call{}", summary.calls, summary.calls == 1 ? "" : "s");
  out += summary.baseline.empty()
             ? "; no kernel was timed\n"
             : fmt::format("; vs base: time over {}'s ({}),\n  the geometric mean over the calls both timed, "
                           "each the whole call (with its input preparation) where that was timed\n",
                           summary.baseline, summary.baseline_note);
  out += fmt::format("  {:<26} {:>5} {:>7} {:>6} {:>8} {:>13} {:>12}  {}\n", "kernel", "ran", "refused", "failed",
                     "vs base", "median rel_l2", "worst rel_l2", "worst call");
  bool any_emulation = false;
  for (const KernelStanding& k : summary.kernels) {
    if (k.ran + k.failed == 0) continue;
    any_emulation = any_emulation || k.emulation;
    const bool judged = !k.worst_call.empty();  // a NaN error prints as nan, no error as -
    out += fmt::format("  {:<26} {:>5} {:>7} {:>6} {:>8} {:>13} {:>12}  {}\n", k.name + (k.emulation ? " (emul.)" : ""),
                       k.ran, k.refused, k.failed, std::isnan(k.vs_baseline) ? "-" : g(k.vs_baseline, 3) + "x",
                       judged ? g(k.median_rel_l2) : "-", judged ? g(k.worst_rel_l2) : "-", k.worst_call);
  }
  if (any_emulation) {
    out += "  (emul.): a CPU emulation of a GPU kernel: its outputs are that kernel's, its time is not meaningful\n";
  }
  for (const Refusal& refusal : summary.refusals) {
    std::vector<std::string> kernels;
    for (const auto& [name, count] : refusal.kernels) {
      kernels.push_back(count == static_cast<int>(summary.calls)
                            ? name
                            : fmt::format("{} ({} call{})", name, count, count == 1 ? "" : "s"));
    }
    out += wrapped(fmt::format("not run, {}: {}", refusal.reason, fmt::join(kernels, ", ")));
  }
  // Compilations ahead, per kernel: their time is in no figure, and went beside the others' timings.
  std::map<std::string, std::pair<int, double>> compiled;
  for (const auto& c : record.value("compilations_ahead", nlohmann::json::array())) {
    auto& [count, seconds] = compiled[c.value("kernel", "")];
    ++count, seconds += c.value("seconds", 0.0);
  }
  for (const auto& [kernel, figures] : compiled) {
    out += wrapped(fmt::format("{} compiled {} kind{} of call ahead, {:.1f} s beside the other kernels' timings (in no "
                               "figure; compilations_ahead in the JSON)",
                               kernel, figures.first, figures.first == 1 ? "" : "s", figures.second));
  }
  out += "  statuses: not_verified ran (no --refcheck), passed within --refcheck, incorrect beyond it (exit 3),\n"
         "  failed raised an error (exit 1), not_supported refused the call (above)\n";
  return out;
}

}  // namespace attnreplay
