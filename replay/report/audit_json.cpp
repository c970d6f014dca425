// The audit record as JSON: the complete form --json writes and every printer reads; each call as
// a run's record writes it, with its layer, step and input diagnostics.
#include <nlohmann/json.hpp>

#include <optional>

#include "replay/judge/distribution.h"
#include "replay/report/records.h"

namespace attnreplay {
namespace {

// A metadata value as the JSON gives it: an integer when it is one ("3"), else the text, else null.
nlohmann::json metadata_value(const CallResult& call, const std::string& key) {
  const auto found = call.metadata.find(key);
  if (found == call.metadata.end()) return nullptr;
  const std::string& text = found->second;
  try {
    std::size_t used = 0;
    const long long number = std::stoll(text, &used);
    if (used == text.size()) return number;
  } catch (const std::exception&) {
  }
  return text;
}

const ErrorStats* error_of(const CallResult& call, const std::string& kernel) {
  for (const KernelResult& k : call.kernels)
    if (k.kernel == kernel) return k.error ? &*k.error : nullptr;
  return nullptr;
}

const KernelResult* kernel_of(const CallResult& call, const std::string& kernel) {
  for (const KernelResult& k : call.kernels)
    if (k.kernel == kernel) return &k;
  return nullptr;
}

nlohmann::json distribution_json(const Distribution& d) {
  return {{"count", d.count}, {"min", json_number(d.min)}, {"median", json_number(d.median)},
          {"p99", json_number(d.p99)}, {"max", json_number(d.max)}};
}

nlohmann::json shape_json(const AttentionShape& s) {
  return {{"batch", s.batch}, {"heads_q", s.heads_q}, {"heads_kv", s.heads_kv}, {"seq_q", s.seq_q},
          {"seq_kv", s.seq_kv}, {"head_dim_qk", s.head_dim_qk}, {"head_dim_vo", s.head_dim_vo}};
}

nlohmann::json diagnostics_json(const InputDiagnostics& d) {
  return {{"k_mean_outlier_ratio", json_number(d.k_mean_outlier_ratio)},
          {"k_mean_over_std", json_number(d.k_mean_over_std)},
          {"k_outlier", {{"batch", d.k_outlier_batch}, {"head", d.k_outlier_head}, {"channel", d.k_outlier_channel}}},
          {"q_amax_spread", json_number(d.q_amax_spread)},
          {"k_amax_spread", json_number(d.k_amax_spread)},
          {"k_smoothed_amax_spread", json_number(d.k_smoothed_amax_spread)}};
}

nlohmann::json errors_brief(const ErrorStats& e) {
  return {{"rel_l2", json_number(e.rel_l2)}, {"cosine", json_number(e.cosine)}, {"max_abs", json_number(e.max_abs)},
          {"mean_abs", json_number(e.mean_abs)}, {"rmse", json_number(e.rmse)}};
}

// A kernel's errors on a shape's random calls: each figure's median over the seeds, rel_l2's
// range, and each call's disposition.
struct RandomErrors {
  std::int64_t calls = 0;
  ErrorStats median;  // rel_l2, cosine, max_abs, mean_abs, rmse: each the median over the calls
  double rel_l2_min = 0, rel_l2_max = 0;
  std::vector<std::string> statuses;
};

std::optional<RandomErrors> random_errors(const ShapeGroup& group, const std::string& kernel) {
  std::vector<double> rel_l2, cosine, max_abs, mean_abs, rmse;
  RandomErrors r;
  for (const CallResult& call : group.random) {
    const KernelResult* result = kernel_of(call, kernel);
    if (!result || !result->error) continue;
    const ErrorStats& e = *result->error;
    rel_l2.push_back(e.rel_l2), cosine.push_back(e.cosine), max_abs.push_back(e.max_abs);
    mean_abs.push_back(e.mean_abs), rmse.push_back(e.rmse);
    r.statuses.emplace_back(disposition_name(result->disposition));
  }
  if (rel_l2.empty()) return std::nullopt;
  r.calls = static_cast<std::int64_t>(rel_l2.size());
  const Distribution spread = distribution_of(rel_l2);
  r.median.rel_l2 = spread.median, r.rel_l2_min = spread.min, r.rel_l2_max = spread.max;
  r.median.cosine = distribution_of(cosine).median, r.median.max_abs = distribution_of(max_abs).median;
  r.median.mean_abs = distribution_of(mean_abs).median, r.median.rmse = distribution_of(rmse).median;
  return r;
}

// Where the captured calls' median rel_l2 lies against the random calls' range.
const char* against_random_range(double captured, const RandomErrors& r) {
  return captured > r.rel_l2_max ? "above" : captured < r.rel_l2_min ? "below" : "within";
}

nlohmann::json calls_json(const AuditReport& report) {
  const std::vector<CallResult>& calls = report.replay.calls;
  nlohmann::json json = nlohmann::json::array();
  for (std::size_t i = 0; i < calls.size(); ++i) {
    nlohmann::json call = call_to_json(calls[i]);
    call["position"] = i;
    call["layer"] = metadata_value(calls[i], "layer");
    call["step"] = metadata_value(calls[i], "step");
    if (i < report.diagnostics.size() && report.diagnostics[i]) call["diagnostics"] = diagnostics_json(*report.diagnostics[i]);
    json.push_back(std::move(call));
  }
  return json;
}

nlohmann::json worst_call_json(const AuditReport& report, const KernelAudit& k, const WorstCall& worst) {
  const CallResult& call = report.replay.calls[worst.call];
  nlohmann::json heads = nlohmann::json::array();
  for (const HeadError& h : worst.per_head) {
    heads.push_back({{"batch", h.batch}, {"head", h.head}, {"rel_l2", json_number(h.rel_l2)},
                     {"cosine", json_number(h.cosine)}, {"max_abs", json_number(h.max_abs)},
                     {"nonfinite_count", h.nonfinite_count}});
  }
  nlohmann::json entry = {{"call", worst.call},
                          {"source", call.source},
                          {"call_index", call.call_index},
                          {"op", call.op},
                          {"layer", metadata_value(call, "layer")},
                          {"step", metadata_value(call, "step")},
                          {"per_head", heads}};
  if (const ErrorStats* e = error_of(call, k.kernel)) entry["error"] = errors_brief(*e);
  if (report.attribute) {
    nlohmann::json stages = nlohmann::json::array();
    for (const StageError& stage : worst.attribution) {
      nlohmann::json s = errors_brief(stage.error);
      s["stages"] = stage.stages;
      stages.push_back(std::move(s));
    }
    entry["attribution"] = stages;
    if (!worst.attribution_note.empty()) entry["attribution_note"] = worst.attribution_note;
  }
  return entry;
}

nlohmann::json kernel_json(const AuditReport& report, const KernelAudit& k) {
  nlohmann::json errors = nlohmann::json::object();
  for (const auto& [statistic, distribution] : k.errors) errors[statistic] = distribution_json(distribution);
  nlohmann::json worst_calls = nlohmann::json::array();
  for (const WorstCall& worst : k.worst) worst_calls.push_back(worst_call_json(report, k, worst));
  const KernelVerdict& v = k.verdict;
  nlohmann::json json = {{"kernel", k.kernel},
                         {"verdict", verdict_name(v.verdict)},
                         {"calls_judged", v.calls_judged},
                         {"calls_failing", v.calls_failing},
                         {"calls_errored", v.calls_errored},
                         {"calls_not_supported", v.calls_not_supported},
                         {"thresholds", k.thresholds},
                         {"not_supported_reasons", k.not_supported_reasons},
                         {"errors", errors},
                         {"median_time_s", distribution_json(k.median_time_s)},
                         {"tflops", distribution_json(k.tflops)},
                         {"worst_calls", worst_calls}};
  if (report.attribute && !k.attribution_note.empty()) json["attribution_note"] = k.attribution_note;
  return json;
}

// A kernel on a shape's captured calls, and with --random-compare on its random calls.
nlohmann::json shape_kernel_json(const AuditReport& report, const ShapeGroup& group, const ShapeGroup::KernelSummary& s) {
  nlohmann::json entry = {{"kernel", s.kernel},
                          {"calls", s.calls},
                          {"median_rel_l2", json_number(s.median_rel_l2)},
                          {"median_cosine", json_number(s.median_cosine)},
                          {"median_max_abs", json_number(s.median_max_abs)},
                          {"median_time_s", s.median_time_s ? json_number(*s.median_time_s) : nlohmann::json()},
                          {"median_tflops", s.median_tflops ? json_number(*s.median_tflops) : nlohmann::json()}};
  if (!report.random_compare) return entry;
  const std::optional<RandomErrors> random = random_errors(group, s.kernel);
  if (!random) {
    entry["random"] = nullptr;
    entry["captured_over_random_rel_l2"] = nullptr;
    entry["captured_vs_random_range"] = nullptr;
    return entry;
  }
  entry["random"] = errors_brief(random->median);
  entry["random"]["calls"] = random->calls;
  entry["random"]["rel_l2_min"] = json_number(random->rel_l2_min);
  entry["random"]["rel_l2_max"] = json_number(random->rel_l2_max);
  entry["random"]["statuses"] = random->statuses;
  entry["captured_over_random_rel_l2"] =
      random->median.rel_l2 > 0 ? json_number(s.median_rel_l2 / random->median.rel_l2) : nlohmann::json();
  entry["captured_vs_random_range"] = against_random_range(s.median_rel_l2, *random);
  return entry;
}

nlohmann::json shape_group_json(const AuditReport& report, const ShapeGroup& group) {
  nlohmann::json summaries = nlohmann::json::array();
  for (const ShapeGroup::KernelSummary& s : group.kernels) summaries.push_back(shape_kernel_json(report, group, s));
  nlohmann::json entry = {{"shape", shape_json(group.shape)},
                          {"dtype", group.dtype},
                          {"is_causal", group.is_causal},
                          {"causal_alignment", causal_alignment_name(group.causal_alignment)},
                          {"scale", json_number(group.scale)},
                          {"any_mask", group.any_mask},
                          {"calls", group.calls},
                          {"kernels", summaries}};
  if (report.random_compare) {
    entry["random_calls"] = nlohmann::json::array();
    for (const CallResult& call : group.random) entry["random_calls"].push_back(call_to_json(call));
  }
  return entry;
}

}  // namespace

nlohmann::json audit_to_json(const AuditReport& report) {
  nlohmann::json kernels = nlohmann::json::array();
  for (const KernelAudit& k : report.kernels) kernels.push_back(kernel_json(report, k));
  nlohmann::json shapes = nlohmann::json::array();
  for (const ShapeGroup& group : report.shapes) shapes.push_back(shape_group_json(report, group));
  nlohmann::json options = {
      {"worst", report.worst_count},
      {"random_compare", report.random_compare},
      {"random_seeds", report.random_seeds},
      {"attribute", report.attribute},
      {"cast_inputs", report.cast_inputs ? nlohmann::json(dtype_name(*report.cast_inputs)) : nlohmann::json()},
      {"quant_options", quant_options_json(report.quant)}};
  return {{"schema", "attnreplay.audit"},
          {"schema_version", AuditReport::kJsonSchemaVersion},
          {"tool_version", report.replay.tool_version},
          {"argv", report.replay.argv},
          {"started_utc", report.replay.started_utc},
          {"environment", report.replay.environment.values},
          {"stopping_rule", report.replay.stopping_rule},
          {"options", options},
          {"units", {{"time", "s"}, {"tflops", "1e12 FLOP/s"}, {"gbytes_per_s", "1e9 B/s"}}},
          {"statistics", audited_statistics()},
          {"kernels", kernels},
          {"shapes", shapes},
          {"calls", calls_json(report)},
          {"input_errors", report.replay.input_errors}};
}

}  // namespace attnreplay
