#include "replay/judge/kernel_summary.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "replay/report/json_values.h"

namespace attnreplay {
namespace {

struct KernelOverCalls {
  KernelStanding standing;
  std::map<std::string, int> refused;                  // reason -> calls
  std::map<std::size_t, double> median_s;              // call position -> its time, where timed
  std::vector<std::pair<double, std::size_t>> rel_l2;  // (error, call position)
};

std::vector<KernelOverCalls> kernels_over_calls(const nlohmann::json& calls) {
  std::vector<KernelOverCalls> kernels;
  std::map<std::string, std::size_t> index;
  for (std::size_t c = 0; c < calls.size(); ++c) {
    for (const auto& k : calls[c].at("kernels")) {
      const std::string name = text_at(k, "kernel");
      if (!index.count(name)) {
        index[name] = kernels.size();
        KernelOverCalls entry;
        entry.standing.name = name;
        entry.standing.emulation = k.value("emulation", false);
        entry.standing.exact = !k.contains("reduced_precision") && name.rfind("reference", 0) != 0;
        kernels.push_back(entry);
      }
      KernelOverCalls& entry = kernels[index[name]];
      const std::string status = text_at(k, "status");
      if (status == "not_supported") {
        ++entry.refused[text_at(k, "reason")];
        continue;
      }
      if (status == "failed") ++entry.standing.failed;
      else ++entry.standing.ran;
      if (const double median = call_time_s(k); median > 0) entry.median_s[c] = median;
      if (const auto error = k.find("error"); error != k.end() && error->is_object()) {
        entry.rel_l2.push_back({number_at(judged_figures(*error), "rel_l2"), c});
      }
    }
  }
  return kernels;
}

// exp(mean(log(a / b))) over the calls both timed; NaN when none.
double geomean_ratio(const KernelOverCalls& a, const KernelOverCalls& b) {
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

const KernelOverCalls* pick_baseline(const std::vector<KernelOverCalls>& kernels, const std::string& wanted,
                                     std::string& note) {
  if (!wanted.empty()) {
    for (const auto& k : kernels) {
      if (k.standing.name == wanted && !k.median_s.empty()) {
        note = "--baseline";
        return &k;
      }
    }
    note = fmt::format("--baseline {} has no time in this run; ", wanted);
  }
  const KernelOverCalls* best = nullptr;
  for (const auto& k : kernels) {
    if (!k.standing.exact || k.standing.emulation || k.median_s.empty()) continue;
    // The fastest: below 1 against the best so far, over the calls both timed.
    const double ratio = best ? geomean_ratio(k, *best) : std::nan("");
    if (!best || ratio < 1 || (std::isnan(ratio) && k.median_s.size() > best->median_s.size())) best = &k;
  }
  if (best) note += "the fastest exact kernel";
  return best;
}

// NaN sorts last: a missing ratio after every ratio, a NaN error as the worst.
double nan_last(double value) { return std::isnan(value) ? std::numeric_limits<double>::infinity() : value; }

}  // namespace

double call_time_s(const nlohmann::json& k) {
  const bool kernel_alone = k.value("timed", std::string("call")) == "kernel";
  for (const char* key : {kernel_alone ? "timing_with_preparation" : "timing", "timing"}) {
    if (const auto timing = k.find(key); timing != k.end() && timing->is_object()) {
      if (const double median = number_at(*timing, "median_s"); median > 0) return median;
    }
  }
  return 0;
}

bool exact_kernel(const nlohmann::json& k) {
  return !k.contains("reduced_precision") && !k.value("emulation", false) &&
         text_at(k, "kernel").rfind("reference", 0) != 0;
}

std::string call_name(const nlohmann::json& call) {
  std::string tag = text_at(call, "case_tag");
  if (tag.size() > 20) tag = "..." + tag.substr(tag.size() - 17);
  return fmt::format("call {}{}", call.value("call_index", -1), tag.empty() ? "" : " [" + tag + "]");
}

KernelSummary summarize_kernels(const nlohmann::json& record, const std::string& baseline) {
  const nlohmann::json& calls = record.at("calls");
  KernelSummary summary;
  summary.calls = calls.size();
  std::vector<KernelOverCalls> kernels = kernels_over_calls(calls);
  const KernelOverCalls* base = pick_baseline(kernels, baseline, summary.baseline_note);
  if (base) summary.baseline = base->standing.name;
  for (KernelOverCalls& k : kernels) {
    KernelStanding& s = k.standing;
    s.timed = static_cast<int>(k.median_s.size());
    s.vs_baseline = base ? geomean_ratio(k, *base) : std::nan("");
    for (const auto& [reason, count] : k.refused) s.refused += count;
    s.median_rel_l2 = s.worst_rel_l2 = std::nan("");
    if (!k.rel_l2.empty()) {
      std::sort(k.rel_l2.begin(), k.rel_l2.end(),
                [](const auto& a, const auto& b) { return nan_last(a.first) < nan_last(b.first); });
      s.median_rel_l2 = k.rel_l2[k.rel_l2.size() / 2].first;
      s.worst_rel_l2 = k.rel_l2.back().first;
      s.worst_call = call_name(calls[k.rel_l2.back().second]);
    }
  }
  // Each refusal once: the kernels that gave one reason, with how many calls each refused.
  for (const KernelOverCalls& k : kernels) {
    for (const auto& [reason, count] : k.refused) {
      auto found = std::find_if(summary.refusals.begin(), summary.refusals.end(),
                                [&](const Refusal& r) { return r.reason == reason; });
      if (found == summary.refusals.end()) found = summary.refusals.insert(summary.refusals.end(), Refusal{reason, {}});
      found->kernels.push_back({k.standing.name, count});
    }
  }
  for (const KernelOverCalls& k : kernels) summary.kernels.push_back(k.standing);
  // Fastest first; those without a ratio after, in their order; those that only refused last.
  std::stable_sort(summary.kernels.begin(), summary.kernels.end(), [](const auto& a, const auto& b) {
    const bool a_ran = a.ran + a.failed > 0, b_ran = b.ran + b.failed > 0;
    if (a_ran != b_ran) return a_ran;
    return nan_last(a.vs_baseline) < nan_last(b.vs_baseline);
  });
  return summary;
}

}  // namespace attnreplay
