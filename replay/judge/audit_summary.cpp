#include "replay/judge/audit_summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>

#include "kernels/kernel.h"

namespace attnreplay {

// ---- Pure statistics ----

const std::vector<std::string>& audited_statistics() {
  static const std::vector<std::string> names{"rel_l2", "cosine", "max_abs", "mean_abs", "rmse"};
  return names;
}

double statistic_of(const ErrorStats& error, const std::string& name) {
  if (name == "rel_l2") return error.rel_l2;
  if (name == "cosine") return error.cosine;
  if (name == "max_abs") return error.max_abs;
  if (name == "mean_abs") return error.mean_abs;
  if (name == "rmse") return error.rmse;
  throw std::invalid_argument("unknown error statistic '" + name + "'");
}

std::string_view verdict_name(Verdict verdict) {
  switch (verdict) {
    case Verdict::passed: return "passed";
    case Verdict::failed: return "failed";
    case Verdict::not_run: return "not_run";
  }
  return "?";
}

KernelVerdict verdict_of(std::span<const Disposition> dispositions) {
  KernelVerdict v;
  for (const Disposition d : dispositions) {
    switch (d) {
      case Disposition::passed: ++v.calls_judged; break;
      case Disposition::incorrect: ++v.calls_judged, ++v.calls_failing; break;
      // An audit always judges; a result without thresholds still ran and counts as judged-within.
      case Disposition::not_verified: ++v.calls_judged; break;
      case Disposition::not_supported: ++v.calls_not_supported; break;
      case Disposition::failed: ++v.calls_errored; break;
    }
  }
  if (v.calls_failing > 0 || v.calls_errored > 0) v.verdict = Verdict::failed;
  else if (v.calls_judged > 0) v.verdict = Verdict::passed;
  else v.verdict = Verdict::not_run;
  return v;
}

std::vector<std::size_t> worst_first(const std::vector<const ErrorStats*>& errors) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < errors.size(); ++i)
    if (errors[i]) order.push_back(i);
  auto nonfinite = [&](std::size_t i) { return errors[i]->nan_count + errors[i]->inf_count > 0; };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (nonfinite(a) != nonfinite(b)) return nonfinite(a);
    const double ra = errors[a]->rel_l2, rb = errors[b]->rel_l2;
    if (std::isnan(ra) != std::isnan(rb)) return std::isnan(ra);  // NaN is no better than anything
    return ra > rb;
  });
  return order;
}

bool AuditReport::any_verdict_failed() const {
  return std::any_of(kernels.begin(), kernels.end(), [](const KernelAudit& k) { return k.verdict.verdict == Verdict::failed; });
}

// ---- Summaries of a filled report ----

namespace {

// The dtype whose default thresholds judged `kernel` on `call`, as the runner chose it.
DType judged_dtype(const std::string& kernel, const CallResult& call) {
  const DType input = parse_dtype(call.dtype).value_or(DType::float32);
  if (const Kernel* k = KernelRegistry::instance().find(kernel)) return k->description().reduced_precision.value_or(input);
  return input;  // model-output: the model's own precision
}

std::string describe_limits(const RefcheckLimits& t) {
  // Enough digits that fp32's 1 - 1e-8 does not print as 1.
  std::string text = fmt::format("cosine >= {:.12g}, rel_l2 <= {:.12g}", t.min_cosine, t.max_rel_l2);
  if (t.max_abs) text += fmt::format(", max_abs <= {:.12g}", *t.max_abs);
  return text;
}

bool is_reference_kernel(const std::string& name) {
  const Kernel* k = KernelRegistry::instance().find(name);
  return k && k->description().is_reference;
}

const KernelResult* find_kernel(const CallResult& call, const std::string& name) {
  for (const KernelResult& k : call.kernels)
    if (k.kernel == name) return &k;
  return nullptr;
}

double median_over(std::vector<double> values) { return distribution_of(std::move(values)).median; }

using PerHeadErrors = std::map<std::pair<std::size_t, std::string>, std::vector<HeadError>>;

// One kernel over every call: its verdict, the spread of each statistic, and its worst calls.
KernelAudit audit_kernel(const AuditReport& report, const std::string& name, const RefcheckThresholds& thresholds,
                         const PerHeadErrors& per_head) {
  const std::vector<CallResult>& calls = report.replay.calls;
  KernelAudit audit;
  audit.kernel = name;
  std::vector<Disposition> dispositions;
  std::vector<const ErrorStats*> errors;
  std::vector<std::size_t> call_of_error;
  std::map<std::string, std::vector<double>> values;
  std::vector<double> times, tflops;
  std::set<std::string> limits;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const KernelResult* k = find_kernel(calls[i], name);
    if (!k) continue;
    dispositions.push_back(k->disposition);
    auto& reasons = audit.not_supported_reasons;
    if (k->disposition == Disposition::not_supported &&
        std::find(reasons.begin(), reasons.end(), k->reason) == reasons.end()) {
      reasons.push_back(k->reason);
    }
    if (k->error) {
      errors.push_back(&*k->error);
      call_of_error.push_back(i);
      for (const std::string& statistic : audited_statistics()) values[statistic].push_back(statistic_of(*k->error, statistic));
      limits.insert(describe_limits(refcheck_limits(thresholds, judged_dtype(name, calls[i]))));
    }
    if (k->timing && !k->timing->untimed()) {
      times.push_back(k->timing->median_s);
      tflops.push_back(k->tflops());
    }
  }
  for (const std::string& statistic : audited_statistics()) audit.errors[statistic] = distribution_of(values[statistic]);
  audit.median_time_s = distribution_of(times);
  audit.tflops = distribution_of(tflops);
  audit.verdict = verdict_of(dispositions);
  audit.thresholds.assign(limits.begin(), limits.end());
  // The reference against itself is exact by construction: no worst calls to show.
  if (is_reference_kernel(name)) return audit;
  const std::vector<std::size_t> order = worst_first(errors);
  for (std::size_t rank = 0; rank < order.size() && rank < static_cast<std::size_t>(std::max(report.worst_count, 0)); ++rank) {
    WorstCall worst;
    worst.call = call_of_error[order[rank]];
    if (auto found = per_head.find({worst.call, name}); found != per_head.end()) worst.per_head = found->second;
    audit.worst.push_back(std::move(worst));
  }
  return audit;
}

// The calls grouped by (shape, layout, dtype, causality), in the order of their first call.
std::vector<ShapeGroup> group_by_shape(const std::vector<CallResult>& calls) {
  std::vector<ShapeGroup> groups;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const CallResult& call = calls[i];
    auto same = [&call](const ShapeGroup& g) {
      return g.shape == call.shape && g.layout == call.layout && g.dtype == call.dtype && g.is_causal == call.is_causal &&
             (!call.is_causal || g.causal_alignment == call.causal_alignment);
    };
    auto group = std::find_if(groups.begin(), groups.end(), same);
    if (group == groups.end()) {
      ShapeGroup g;
      g.shape = call.shape;
      g.layout = call.layout;
      g.dtype = call.dtype;
      g.is_causal = call.is_causal;
      g.causal_alignment = call.causal_alignment;
      g.scale = call.scale;
      groups.push_back(std::move(g));
      group = groups.end() - 1;
    }
    group->calls.push_back(i);
    group->any_mask = group->any_mask || call.mask != "none";
  }
  return groups;
}

// A kernel's medians over a shape group's calls; nullopt when it ran none of them.
std::optional<ShapeGroup::KernelSummary> summarize_on_group(const std::vector<CallResult>& calls, const ShapeGroup& group,
                                                           const std::string& name) {
  ShapeGroup::KernelSummary summary;
  summary.kernel = name;
  std::vector<double> rel_l2, cosine, max_abs, times, tflops;
  for (const std::size_t i : group.calls) {
    const KernelResult* k = find_kernel(calls[i], name);
    if (!k || !k->error) continue;
    rel_l2.push_back(k->error->rel_l2);
    cosine.push_back(k->error->cosine);
    max_abs.push_back(k->error->max_abs);
    if (k->timing && !k->timing->untimed()) times.push_back(k->timing->median_s), tflops.push_back(k->tflops());
  }
  summary.calls = static_cast<std::int64_t>(rel_l2.size());
  if (summary.calls == 0) return std::nullopt;
  summary.median_rel_l2 = median_over(rel_l2);
  summary.median_cosine = median_over(cosine);
  summary.median_max_abs = median_over(max_abs);
  if (!times.empty()) summary.median_time_s = median_over(times), summary.median_tflops = median_over(tflops);
  return summary;
}

}  // namespace

void summarize_audit(AuditReport& report, const RefcheckThresholds& thresholds, const PerHeadErrors& per_head) {
  const std::vector<CallResult>& calls = report.replay.calls;
  std::vector<std::string> names;  // in the order kernels first appear
  for (const CallResult& call : calls)
    for (const KernelResult& k : call.kernels)
      if (std::find(names.begin(), names.end(), k.kernel) == names.end()) names.push_back(k.kernel);
  report.kernels.clear();
  for (const std::string& name : names) report.kernels.push_back(audit_kernel(report, name, thresholds, per_head));
  report.shapes = group_by_shape(calls);
  for (ShapeGroup& group : report.shapes) {
    for (const std::string& name : names) {
      if (auto summary = summarize_on_group(calls, group, name)) group.kernels.push_back(std::move(*summary));
    }
  }
}

}  // namespace attnreplay
