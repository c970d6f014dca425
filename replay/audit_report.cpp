// Printers of the audit record: the console table, the JSON (the complete record) and the CSV (one
// row per call and kernel). They read an AuditReport and never measure.
#include <cmath>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>

#include "replay/audit.h"
#include "replay/report.h"

namespace attnreplay {
namespace {

std::string g(double value, int digits = 3) {
  if (std::isnan(value)) return "-";
  return fmt::format("{:.{}g}", value, digits);
}

// Near 1 the distance from 1 is what tells kernels apart: "1-2.1e-14" rather than 1.00000000.
std::string cosine_text(double value) {
  if (std::isnan(value)) return "-";
  const double off = value - 1.0;
  if (std::abs(off) <= 4 * std::numeric_limits<double>::epsilon()) return "1";  // fp64 rounding of an exact 1
  if (std::abs(off) <= 1e-4) return fmt::format("1{}{:.2g}", off < 0 ? "-" : "+", std::abs(off));
  return fmt::format("{:.6f}", value);
}

std::string statistic_text(const std::string& statistic, double value) {
  return statistic == "cosine" ? cosine_text(value) : g(value);
}

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

std::string metadata_text(const CallResult& call, const std::string& key) {
  const auto found = call.metadata.find(key);
  return found == call.metadata.end() ? "-" : found->second;
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

std::string describe_diagnostics(const InputDiagnostics& d) {
  return fmt::format("K mean outlier {}x (over channel std {}x) at b{} h{} c{}; INT8 amax spread Q {}x, K {}x, "
                     "smoothed K {}x",
                     g(d.k_mean_outlier_ratio), g(d.k_mean_over_std), d.k_outlier_batch, d.k_outlier_head,
                     d.k_outlier_channel, g(d.q_amax_spread), g(d.k_amax_spread), g(d.k_smoothed_amax_spread));
}

}  // namespace

void print_audit_table(const AuditReport& report, std::ostream& out) {
  const std::vector<CallResult>& calls = report.replay.calls;
  auto count = [](std::size_t n, std::string_view noun) { return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s"); };
  out << fmt::format("audit: {} in {}, {}; errors against the fp64 reference{}\n\n", count(calls.size(), "call"),
                     count(report.shapes.size(), "shape"), count(report.kernels.size(), "kernel"),
                     report.cast_inputs ? fmt::format(", inputs cast to {}", dtype_name(*report.cast_inputs)) : "");

  out << fmt::format("{:<20} {:<8} {:>6} {:>6} {:>6} {:>6} {:>11} {:>9}  {}\n", "kernel", "verdict", "calls", "fail",
                     "error", "n/s", "median ms", "TFLOP/s", "thresholds");
  for (const KernelAudit& k : report.kernels) {
    const KernelVerdict& v = k.verdict;
    out << fmt::format("{:<20} {:<8} {:>6} {:>6} {:>6} {:>6} {:>11} {:>9}  {}\n", k.kernel, verdict_name(v.verdict),
                       v.calls_judged, v.calls_failing, v.calls_errored, v.calls_not_supported,
                       g(k.median_time_s.median * 1e3, 4), g(k.tflops.median, 4), fmt::join(k.thresholds, "; "));
  }
  out << "  (calls: ran and judged; fail: over a threshold; error: the kernel threw; n/s: not supported;\n"
         "   median ms and TFLOP/s: the median over calls of each call's median)\n";
  for (const KernelAudit& k : report.kernels) {
    for (const std::string& reason : k.not_supported_reasons) out << fmt::format("  {} declined: {}\n", k.kernel, reason);
  }
  out << '\n';

  out << fmt::format("{:<20} {:<10} {:>12} {:>12} {:>12} {:>12}\n", "kernel", "statistic", "min", "median", "p99", "max");
  for (const KernelAudit& k : report.kernels) {
    bool first = true;
    for (const std::string& statistic : audited_statistics()) {
      const Distribution& d = k.errors.at(statistic);
      if (d.count == 0) continue;
      out << fmt::format("{:<20} {:<10} {:>12} {:>12} {:>12} {:>12}\n", first ? k.kernel : "", statistic,
                         statistic_text(statistic, d.min), statistic_text(statistic, d.median),
                         statistic_text(statistic, d.p99), statistic_text(statistic, d.max));
      first = false;
    }
  }
  out << '\n';

  bool any_worst = false;
  for (const KernelAudit& k : report.kernels) any_worst = any_worst || !k.worst.empty();
  if (any_worst) {
    out << fmt::format("worst calls by rel_l2 (up to {} per kernel), with their three worst (batch, head)\n", report.worst_count);
    for (const KernelAudit& k : report.kernels) {
      if (k.worst.empty()) continue;
      out << k.kernel << (report.attribute && !k.attribution_note.empty() ? fmt::format(": {}", k.attribution_note) : "")
          << '\n';
      out << fmt::format("  {:>6}  {:<34} {:>5} {:>5} {:>10} {:>12} {:>10}  {}\n", "call", "op", "layer", "step", "rel_l2",
                         "cosine", "max_abs", "worst heads: b,h rel_l2");
      for (const WorstCall& worst : k.worst) {
        const CallResult& call = calls[worst.call];
        const ErrorStats* e = error_of(call, k.kernel);
        std::vector<HeadError> heads = worst.per_head;
        std::stable_sort(heads.begin(), heads.end(), [](const HeadError& a, const HeadError& b) { return a.rel_l2 > b.rel_l2; });
        std::vector<std::string> head_texts;
        for (std::size_t i = 0; i < heads.size() && i < 3; ++i)
          head_texts.push_back(fmt::format("{},{} {}", heads[i].batch, heads[i].head, g(heads[i].rel_l2)));
        out << fmt::format("  {:>6}  {:<34} {:>5} {:>5} {:>10} {:>12} {:>10}  {}\n", call.call_index,
                           call.op.empty() ? "-" : call.op, metadata_text(call, "layer"), metadata_text(call, "step"),
                           e ? g(e->rel_l2) : "-", e ? cosine_text(e->cosine) : "-", e ? g(e->max_abs) : "-",
                           fmt::join(head_texts, "; "));
        if (!worst.attribution.empty()) {
          std::vector<std::string> stages;
          for (const StageError& stage : worst.attribution) stages.push_back(fmt::format("{} {}", stage.stages, g(stage.error.rel_l2)));
          out << fmt::format("          rel_l2 with quantization steps on: {}\n", fmt::join(stages, ", "));
        } else if (!worst.attribution_note.empty()) {
          out << fmt::format("          {}\n", worst.attribution_note);
        }
        if (worst.call < report.diagnostics.size() && report.diagnostics[worst.call]) {
          out << fmt::format("          inputs: {}\n", describe_diagnostics(*report.diagnostics[worst.call]));
        }
      }
    }
    out << '\n';
  }

  if (report.random_compare) {
    out << fmt::format(
        "captured against random inputs: median rel_l2 over the captured calls of each shape, beside {} call(s) of\n"
        "standard normal inputs of that shape (seeds --seed and on): their median and range; ratio = captured over\n"
        "random median (> 1: the real tensors are harder than random ones); above/below: outside the random range\n",
        report.random_seeds);
    out << fmt::format("  {:<44} {:<9} {:<7} {:>5}  {:<20} {:>10} {:>10} {:>21} {:>8} {:>7}\n", "shape", "dtype", "causal",
                       "calls", "kernel", "captured", "random", "random range", "ratio", "");
    for (const ShapeGroup& group : report.shapes) {
      bool first = true;
      for (const ShapeGroup::KernelSummary& summary : group.kernels) {
        const std::optional<RandomErrors> random = random_errors(group, summary.kernel);
        const double ratio = random && random->median.rel_l2 > 0 ? summary.median_rel_l2 / random->median.rel_l2 : NAN;
        out << fmt::format("  {:<44} {:<9} {:<7} {:>5}  {:<20} {:>10} {:>10} {:>21} {:>8} {:>7}\n",
                           first ? group.shape.to_string() : "", first ? group.dtype : "",
                           first ? (group.is_causal ? "yes" : "no") : "", first ? std::to_string(group.calls.size()) : "",
                           summary.kernel, g(summary.median_rel_l2), random ? g(random->median.rel_l2) : "-",
                           random ? fmt::format("{} .. {}", g(random->rel_l2_min), g(random->rel_l2_max)) : "-", g(ratio),
                           random ? against_random_range(summary.median_rel_l2, *random) : "");
        first = false;
      }
    }
    out << '\n';
  }
  for (const std::string& error : report.replay.input_errors) out << "error: " << error << '\n';
}

nlohmann::json audit_to_json(const AuditReport& report) {
  const std::vector<CallResult>& calls = report.replay.calls;
  nlohmann::json calls_json = nlohmann::json::array();
  for (std::size_t i = 0; i < calls.size(); ++i) {
    nlohmann::json call = call_to_json(calls[i]);
    call["position"] = i;
    call["layer"] = metadata_value(calls[i], "layer");
    call["step"] = metadata_value(calls[i], "step");
    if (i < report.diagnostics.size() && report.diagnostics[i]) call["diagnostics"] = diagnostics_json(*report.diagnostics[i]);
    calls_json.push_back(std::move(call));
  }

  nlohmann::json kernels = nlohmann::json::array();
  for (const KernelAudit& k : report.kernels) {
    nlohmann::json errors = nlohmann::json::object();
    for (const auto& [statistic, distribution] : k.errors) errors[statistic] = distribution_json(distribution);
    nlohmann::json worst_calls = nlohmann::json::array();
    for (const WorstCall& worst : k.worst) {
      const CallResult& call = calls[worst.call];
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
      worst_calls.push_back(std::move(entry));
    }
    const KernelVerdict& v = k.verdict;
    kernels.push_back({{"kernel", k.kernel},
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
                       {"worst_calls", worst_calls}});
    if (report.attribute && !k.attribution_note.empty()) kernels.back()["attribution_note"] = k.attribution_note;
  }

  nlohmann::json shapes = nlohmann::json::array();
  for (const ShapeGroup& group : report.shapes) {
    nlohmann::json summaries = nlohmann::json::array();
    for (const ShapeGroup::KernelSummary& s : group.kernels) {
      nlohmann::json entry = {{"kernel", s.kernel},
                              {"calls", s.calls},
                              {"median_rel_l2", json_number(s.median_rel_l2)},
                              {"median_cosine", json_number(s.median_cosine)},
                              {"median_max_abs", json_number(s.median_max_abs)},
                              {"median_time_s", s.median_time_s ? json_number(*s.median_time_s) : nlohmann::json()},
                              {"median_tflops", s.median_tflops ? json_number(*s.median_tflops) : nlohmann::json()}};
      if (report.random_compare) {
        const std::optional<RandomErrors> random = random_errors(group, s.kernel);
        if (random) {
          entry["random"] = errors_brief(random->median);
          entry["random"]["calls"] = random->calls;
          entry["random"]["rel_l2_min"] = json_number(random->rel_l2_min);
          entry["random"]["rel_l2_max"] = json_number(random->rel_l2_max);
          entry["random"]["statuses"] = random->statuses;
          entry["captured_over_random_rel_l2"] =
              random->median.rel_l2 > 0 ? json_number(s.median_rel_l2 / random->median.rel_l2) : nlohmann::json();
          entry["captured_vs_random_range"] = against_random_range(s.median_rel_l2, *random);
        } else {
          entry["random"] = nullptr;
          entry["captured_over_random_rel_l2"] = nullptr;
          entry["captured_vs_random_range"] = nullptr;
        }
      }
      summaries.push_back(std::move(entry));
    }
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
    shapes.push_back(std::move(entry));
  }

  nlohmann::json options = {
      {"worst", report.worst_count},
      {"random_compare", report.random_compare},
      {"random_seeds", report.random_seeds},
      {"attribute", report.attribute},
      {"cast_inputs", report.cast_inputs ? nlohmann::json(dtype_name(*report.cast_inputs)) : nlohmann::json()},
      {"quant_options",
       {{"quant_gran", to_string(report.quant.quant_gran)},
        {"k_smooth", report.quant.k_smooth},
        {"pv_accum_dtype", to_string(report.quant.pv_accum)},
        {"fp8_scale", to_string(report.quant.fp8_scale)}}}};
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
          {"calls", calls_json},
          {"input_errors", report.replay.input_errors}};
}

void write_audit_json(const AuditReport& report, std::ostream& out) { out << audit_to_json(report).dump(2) << '\n'; }

namespace {

struct AuditColumn {
  std::string name;
  std::function<nlohmann::json(const CallResult&, const KernelResult&, const InputDiagnostics*)> value;
};

const std::vector<AuditColumn>& audit_columns() {
  using D = const InputDiagnostics*;
  auto error = [](double ErrorStats::* field) {
    return [field](const CallResult&, const KernelResult& k, D) {
      return k.error ? json_number((*k.error).*field) : nlohmann::json();
    };
  };
  auto count = [](std::int64_t ErrorStats::* field) {
    return [field](const CallResult&, const KernelResult& k, D) { return k.error ? nlohmann::json((*k.error).*field) : nlohmann::json(); };
  };
  auto diagnostic = [](double InputDiagnostics::* field) {
    return [field](const CallResult&, const KernelResult&, D d) { return d ? json_number(d->*field) : nlohmann::json(); };
  };
  auto dim = [](std::int64_t AttentionShape::* field) {
    return [field](const CallResult& c, const KernelResult&, D) { return nlohmann::json(c.shape.*field); };
  };
  static const std::vector<AuditColumn> list = {
      {"source", [](const CallResult& c, const KernelResult&, D) { return nlohmann::json(c.source); }},
      {"call_index", [](const CallResult& c, const KernelResult&, D) { return nlohmann::json(c.call_index); }},
      {"op", [](const CallResult& c, const KernelResult&, D) { return nlohmann::json(c.op); }},
      {"layer", [](const CallResult& c, const KernelResult&, D) { return metadata_value(c, "layer"); }},
      {"step", [](const CallResult& c, const KernelResult&, D) { return metadata_value(c, "step"); }},
      {"batch", dim(&AttentionShape::batch)},
      {"heads_q", dim(&AttentionShape::heads_q)},
      {"heads_kv", dim(&AttentionShape::heads_kv)},
      {"seq_q", dim(&AttentionShape::seq_q)},
      {"seq_kv", dim(&AttentionShape::seq_kv)},
      {"head_dim_qk", dim(&AttentionShape::head_dim_qk)},
      {"head_dim_vo", dim(&AttentionShape::head_dim_vo)},
      {"dtype", [](const CallResult& c, const KernelResult&, D) { return nlohmann::json(c.dtype); }},
      {"is_causal", [](const CallResult& c, const KernelResult&, D) { return nlohmann::json(c.is_causal); }},
      {"kernel", [](const CallResult&, const KernelResult& k, D) { return nlohmann::json(k.kernel); }},
      {"status", [](const CallResult&, const KernelResult& k, D) { return nlohmann::json(disposition_name(k.disposition)); }},
      {"median_s", [](const CallResult&, const KernelResult& k, D) { return k.timing ? json_number(k.timing->median_s) : nlohmann::json(); }},
      {"tflops", [](const CallResult&, const KernelResult& k, D) { return k.timing ? json_number(k.tflops()) : nlohmann::json(); }},
      {"rel_l2", error(&ErrorStats::rel_l2)},
      {"cosine", error(&ErrorStats::cosine)},
      {"max_abs", error(&ErrorStats::max_abs)},
      {"mean_abs", error(&ErrorStats::mean_abs)},
      {"rmse", error(&ErrorStats::rmse)},
      {"rel_l1", error(&ErrorStats::rel_l1)},
      {"nan_count", count(&ErrorStats::nan_count)},
      {"inf_count", count(&ErrorStats::inf_count)},
      {"refcheck_failures", [](const CallResult&, const KernelResult& k, D) { return nlohmann::json(fmt::format("{}", fmt::join(k.refcheck_failures, "; "))); }},
      {"k_mean_outlier_ratio", diagnostic(&InputDiagnostics::k_mean_outlier_ratio)},
      {"k_mean_over_std", diagnostic(&InputDiagnostics::k_mean_over_std)},
      {"q_amax_spread", diagnostic(&InputDiagnostics::q_amax_spread)},
      {"k_amax_spread", diagnostic(&InputDiagnostics::k_amax_spread)},
      {"k_smoothed_amax_spread", diagnostic(&InputDiagnostics::k_smoothed_amax_spread)},
      {"reason", [](const CallResult&, const KernelResult& k, D) { return nlohmann::json(k.reason); }},
      {"rerun", [](const CallResult&, const KernelResult& k, D) { return nlohmann::json(k.rerun); }},
  };
  return list;
}

}  // namespace

const std::vector<std::string>& audit_csv_columns() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const AuditColumn& column : audit_columns()) out.push_back(column.name);
    return out;
  }();
  return names;
}

void write_audit_csv(const AuditReport& report, std::ostream& out) {
  out << fmt::format("{}\n", fmt::join(audit_csv_columns(), ","));
  const std::vector<CallResult>& calls = report.replay.calls;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const InputDiagnostics* diagnostics =
        i < report.diagnostics.size() && report.diagnostics[i] ? &*report.diagnostics[i] : nullptr;
    for (const KernelResult& kernel : calls[i].kernels) {
      std::vector<std::string> fields;
      for (const AuditColumn& column : audit_columns()) fields.push_back(csv_field(column.value(calls[i], kernel, diagnostics)));
      out << fmt::format("{}\n", fmt::join(fields, ","));
    }
  }
}

}  // namespace attnreplay
