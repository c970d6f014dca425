#include "replay/report/run_summary.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "replay/report/json_values.h"
#include "replay/report/number_format.h"

namespace attnreplay {
namespace {

struct KernelOverRun {
  std::string name;
  bool emulation = false, exact = true;
  int ran = 0, failed = 0;
  std::map<std::string, int> refused;          // reason -> calls
  std::map<std::size_t, double> median_s;      // call position -> its time, where timed
  std::vector<std::pair<double, std::size_t>> rel_l2;  // (error, call position)
};

// "call 3 [flux-4096]"; a long tag (a test list's path and line) keeps its end.
std::string call_name(const nlohmann::json& call) {
  std::string tag = text_at(call, "case_tag");
  if (tag.size() > 20) tag = "..." + tag.substr(tag.size() - 17);
  return fmt::format("call {}{}", call.value("call_index", -1), tag.empty() ? "" : " [" + tag + "]");
}

std::vector<KernelOverRun> kernels_over_run(const nlohmann::json& calls) {
  std::vector<KernelOverRun> kernels;
  std::map<std::string, std::size_t> index;
  for (std::size_t c = 0; c < calls.size(); ++c) {
    for (const auto& k : calls[c].at("kernels")) {
      const std::string name = text_at(k, "kernel");
      if (!index.count(name)) {
        index[name] = kernels.size();
        KernelOverRun entry;
        entry.name = name;
        entry.emulation = k.value("emulation", false);
        entry.exact = !k.contains("reduced_precision") && name.rfind("reference", 0) != 0;
        kernels.push_back(entry);
      }
      KernelOverRun& entry = kernels[index[name]];
      const std::string status = text_at(k, "status");
      if (status == "not_supported") {
        ++entry.refused[text_at(k, "reason")];
        continue;
      }
      if (status == "failed") ++entry.failed;
      else ++entry.ran;
      if (const auto timing = k.find("timing"); timing != k.end() && timing->is_object()) {
        if (const double median = number_at(*timing, "median_s"); median > 0) entry.median_s[c] = median;
      }
      if (const auto error = k.find("error"); error != k.end() && error->is_object()) {
        entry.rel_l2.push_back({number_at(*error, "rel_l2"), c});
      }
    }
  }
  return kernels;
}

// exp(mean(log(a / b))) over the calls both timed; NaN when none.
double geomean_ratio(const KernelOverRun& a, const KernelOverRun& b) {
  double sum = 0;
  int n = 0;
  for (const auto& [call, time] : a.median_s) {
    if (const auto other = b.median_s.find(call); other != b.median_s.end()) {
      sum += std::log(time / other->second);
      ++n;
    }
  }
  return n ? std::exp(sum / n) : std::nan("");
}

const KernelOverRun* pick_baseline(const std::vector<KernelOverRun>& kernels, const std::string& wanted,
                                   std::string& note) {
  if (!wanted.empty()) {
    for (const auto& k : kernels) {
      if (k.name == wanted && !k.median_s.empty()) {
        note = "--baseline";
        return &k;
      }
    }
    note = fmt::format("--baseline {} has no time in this run; ", wanted);
  }
  const KernelOverRun* best = nullptr;
  for (const auto& k : kernels) {
    if (!k.exact || k.emulation || k.median_s.empty()) continue;
    // The fastest: below 1 against the best so far, over the calls both timed.
    const double ratio = best ? geomean_ratio(k, *best) : std::nan("");
    if (!best || ratio < 1 || (std::isnan(ratio) && k.median_s.size() > best->median_s.size())) best = &k;
  }
  if (best) note += "the fastest exact kernel";
  return best;
}

// `text` in lines of at most 116 characters after a two-space indent (six on the lines after the
// first), broken at spaces.
std::string wrapped(const std::string& text) {
  constexpr std::size_t kWidth = 116;
  std::string out, line = "  ";
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(start, end - start);
    if (line.size() + word.size() > kWidth && line.find_first_not_of(' ') != std::string::npos) {
      line.pop_back();  // the space after the last word
      out += line + "\n";
      line = "      ";
    }
    line += word + " ";
    start = end + 1;
  }
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return out + line + "\n";
}

std::string median_of(std::vector<std::pair<double, std::size_t>> values) {
  if (values.empty()) return "-";
  std::sort(values.begin(), values.end());
  return g(values[values.size() / 2].first);
}

}  // namespace

std::string run_summary_text(const nlohmann::json& record, const std::string& baseline) {
  const nlohmann::json& calls = record.at("calls");
  if (calls.empty()) return {};
  const std::vector<KernelOverRun> kernels = kernels_over_run(calls);
  std::string note;
  const KernelOverRun* base = pick_baseline(kernels, baseline, note);
  std::string out = fmt::format("\nsummary over {} call{}", calls.size(), calls.size() == 1 ? "" : "s");
  out += base ? fmt::format("; vs base: time over {}'s ({}),\n  the geometric mean over the calls both timed\n",
                            base->name, note)
              : "; no kernel was timed\n";
  out += fmt::format("  {:<26} {:>5} {:>7} {:>6} {:>8} {:>13} {:>12}  {}\n", "kernel", "ran", "refused", "failed",
                     "vs base", "median rel_l2",
                     "worst rel_l2", "worst call");
  bool any_emulation = false;
  // Each kernel's ratio to the baseline, once; fastest first, those without one last, in their order.
  std::vector<std::pair<double, const KernelOverRun*>> order;
  for (const KernelOverRun& k : kernels) order.push_back({base ? geomean_ratio(k, *base) : std::nan(""), &k});
  const auto sort_key = [](double value) { return std::isnan(value) ? std::numeric_limits<double>::infinity() : value; };
  std::stable_sort(order.begin(), order.end(),
                   [&](const auto& a, const auto& b) { return sort_key(a.first) < sort_key(b.first); });
  for (const auto& [ratio, kernel] : order) {
    const KernelOverRun& k = *kernel;
    if (k.ran + k.failed == 0) continue;
    int refused = 0;
    for (const auto& [reason, count] : k.refused) refused += count;
    std::string worst = "-", worst_call;
    if (!k.rel_l2.empty()) {
      // A NaN error is the worst.
      const auto it = std::max_element(k.rel_l2.begin(), k.rel_l2.end(),
                                       [&](const auto& a, const auto& b) { return sort_key(a.first) < sort_key(b.first); });
      worst = g(it->first);
      worst_call = call_name(calls[it->second]);
    }
    any_emulation = any_emulation || k.emulation;
    out += fmt::format("  {:<26} {:>5} {:>7} {:>6} {:>8} {:>13} {:>12}  {}\n", k.name + (k.emulation ? " (emul.)" : ""),
                       k.ran, refused, k.failed, std::isnan(ratio) ? "-" : g(ratio, 3) + "x", median_of(k.rel_l2), worst,
                       worst_call);
  }
  if (any_emulation) {
    out += "  (emul.): a CPU emulation of a GPU kernel: its outputs are that kernel's, its time is not meaningful\n";
  }
  // Each refusal once: the kernels that gave one reason, with how many calls each refused.
  std::map<std::string, std::vector<std::string>> refusals;
  std::vector<std::string> reasons;
  for (const KernelOverRun& k : kernels) {
    for (const auto& [reason, count] : k.refused) {
      if (!refusals.count(reason)) reasons.push_back(reason);
      refusals[reason].push_back(count == static_cast<int>(calls.size())
                                     ? k.name
                                     : fmt::format("{} ({} call{})", k.name, count, count == 1 ? "" : "s"));
    }
  }
  for (const std::string& reason : reasons) {
    out += wrapped(fmt::format("not run, {}: {}", reason, fmt::join(refusals[reason], ", ")));
  }
  out += "  statuses: not_verified ran (no --refcheck), passed within --refcheck, incorrect beyond it (exit 3),\n"
         "  failed raised an error (exit 1), not_supported refused the call (above)\n";
  return out;
}

}  // namespace attnreplay
