// The results record as JSON: every figure with its unit, the complete form --json writes and every
// printer reads.
#include <cmath>
#include <ostream>

#include "replay/report/printer.h"
#include "replay/report/records.h"

namespace attnreplay {
namespace {

// JSON has no NaN or Infinity: such values are written as null.
nlohmann::json number(double value) { return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(); }

// A clock or power of 0 was not read (CPU kernels, no NVML): null.
nlohmann::json reading_or_null(double reading) { return reading > 0 ? number(reading) : nlohmann::json(); }

nlohmann::json timing_json(const TimingSummary& t) {
  return {{"method", t.method},         {"cache", t.cache},
          {"warmup_runs", t.warmup_runs}, {"samples", t.samples},
          {"discarded_samples", t.discarded}, {"median_s", number(t.median_s)},
          {"min_s", number(t.min_s)},   {"max_s", number(t.max_s)},
          {"mean_s", number(t.mean_s)}, {"stdev_rel", number(t.stdev_rel)}, {"spread_rel", number(t.spread_rel)},
          {"median_ci_low_s", number(t.median_low_s)}, {"median_ci_high_s", number(t.median_high_s)},
          {"measured_s", number(t.measured_s)}, {"stop_reason", t.stop_reason},
          {"runs_per_sample", t.runs_per_sample},
          {"sm_clock_median_mhz", reading_or_null(t.sm_clock_median_mhz)},
          {"sm_clock_min_mhz", reading_or_null(t.sm_clock_min_mhz)},
          {"sm_clock_max_mhz", reading_or_null(t.sm_clock_max_mhz)},
          {"power_median_w", reading_or_null(t.power_median_w)},
          {"power_capped_fraction", t.sm_clock_median_mhz > 0 ? number(t.power_capped_fraction) : nlohmann::json()}};
}

nlohmann::json moments_json(const TensorMoments& m) {
  return {{"min", number(m.min)}, {"max", number(m.max)}, {"mean", number(m.mean)}, {"std", number(m.std)}};
}

nlohmann::json figures_json(const ErrorFigures& e) {
  return {{"elements", e.elements},
          {"max_abs", number(e.max_abs)},
          {"mean_abs", number(e.mean_abs)},
          {"mse", number(e.mse)},
          {"rmse", number(e.rmse)},
          {"std_abs", number(e.std_abs)},
          {"rel_l1", number(e.rel_l1)},
          {"rel_l2", number(e.rel_l2)},
          {"cosine", number(e.cosine)},
          {"max_rel", number(e.max_rel)},
          {"beyond_tolerance", e.beyond_tolerance},
          {"nan_count", e.nan_count},
          {"inf_count", e.inf_count},
          {"worst", {{"batch", e.worst_batch}, {"head", e.worst_head}, {"row", e.worst_row}, {"channel", e.worst_channel}}},
          {"output", moments_json(e.output)},
          {"reference", moments_json(e.reference)}};
}

nlohmann::json error_json(const ErrorStats& e) {
  nlohmann::json j = figures_json(e);
  j["sampled"] = e.sampled;
  j["rows_compared"] = e.rows_compared;
  if (const auto& whole = e.including_rows_without_a_key) {
    j["no_key_rows"] = e.no_key_rows;
    j["including_rows_without_a_key"] = figures_json(*whole);
  }
  return j;
}

nlohmann::json work_json(const AttentionWork& w) {
  return {{"flops", w.flops}, {"bytes", w.bytes}, {"arithmetic_intensity", number(w.arithmetic_intensity())}};
}

nlohmann::json kernel_json(const KernelResult& k) {
  nlohmann::json j = {{"kernel", k.kernel},
                      {"status", disposition_name(k.disposition)},
                      {"reason", k.reason},
                      {"rerun", k.rerun},
                      {"refcheck_failures", k.refcheck_failures}};
  if (!k.detail.empty()) j["detail"] = k.detail;
  if (k.source != "built-in") j["kernel_source"] = k.source;
  if (k.emulation) j["emulation"] = true;
  if (!k.reduced_precision.empty()) j["reduced_precision"] = k.reduced_precision;
  if (!k.timing_shared_from.empty()) j["timing_shared_from"] = k.timing_shared_from;
  if (k.compile_s) j["compile_s"] = number(*k.compile_s);
  if (k.timing_with_preparation) j["timing_with_preparation"] = timing_json(*k.timing_with_preparation);
  if (k.timing_kernel_alone) j["timing_kernel_alone"] = timing_json(*k.timing_kernel_alone);
  if (k.timing_of_preparation) j["timing_of_preparation"] = timing_json(*k.timing_of_preparation);
  if (k.preparation) {
    const auto seconds = k.preparation_s();
    const auto ratio = k.preparation_ratio();
    j["preparation"] = {{"bytes", number(k.preparation->bytes)},
                        {"bound_s", k.preparation->bound_s > 0 ? number(k.preparation->bound_s) : nlohmann::json()},
                        {"time_s", seconds ? number(*seconds) : nlohmann::json()},
                        {"ratio_to_bound", ratio ? number(*ratio) : nlohmann::json()}};
  }
  if (k.timing) {
    j["timing"] = timing_json(*k.timing);
    j["timed"] = k.timed;
    j["tflops"] = number(k.tflops());
    j["gbytes_per_s"] = number(k.gbytes_per_s());
  }
  if (k.error) j["error"] = error_json(*k.error);
  if (k.matrix_ceiling_fraction) j["matrix_ceiling_fraction"] = number(*k.matrix_ceiling_fraction);
  if (k.copy_ceiling_fraction) j["copy_ceiling_fraction"] = number(*k.copy_ceiling_fraction);
  return j;
}

}  // namespace

nlohmann::json quant_options_json(const QuantOptions& o) {
  return {{"quant_gran", to_string(o.quant_gran)},
          {"k_smooth", o.k_smooth},
          {"pv_accum_dtype", to_string(o.pv_accum)},
          {"fp8_scale", to_string(o.fp8_scale)}};
}

nlohmann::json json_number(double value) { return number(value); }

// A ragged call's sequences as {"q_lens": [...], "k_lens": [...]}; null for a dense call.
nlohmann::json sequences_json(const std::vector<std::pair<std::int64_t, std::int64_t>>& lengths) {
  if (lengths.empty()) return nullptr;
  nlohmann::json q = nlohmann::json::array(), k = nlohmann::json::array();
  for (const auto& [q_len, k_len] : lengths) q.push_back(q_len), k.push_back(k_len);
  return {{"q_lens", q}, {"k_lens", k}};
}

nlohmann::json call_to_json(const CallResult& c) {
  nlohmann::json kernels = nlohmann::json::array();
  for (const auto& k : c.kernels) kernels.push_back(kernel_json(k));
  const AttentionShape& s = c.shape;
  return {{"source", c.source},
          {"call_index", c.call_index},
          {"op", c.op},
          {"backend", c.backend},
          {"shape",
           {{"batch", s.batch}, {"heads_q", s.heads_q}, {"heads_kv", s.heads_kv}, {"seq_q", s.seq_q},
            {"seq_kv", s.seq_kv}, {"head_dim_qk", s.head_dim_qk}, {"head_dim_vo", s.head_dim_vo}}},
          {"dtype", c.dtype},
          {"layout", layout_name(c.layout)},
          {"is_causal", c.is_causal},
          {"causal_alignment", causal_alignment_name(c.causal_alignment)},
          {"mask", c.mask},
          {"mask_structure", c.mask_structure},
          {"extensions", c.extensions},
          {"batching", c.batching},
          {"sequences", sequences_json(c.sequence_lengths)},
          {"scale", number(c.scale)},
          {"metadata", c.metadata},
          {"notes", c.notes},
          {"quant_options", quant_options_json(c.quant_options)},
          {"case_tag", c.case_tag},
          {"work", work_json(c.work)},
          {"reference", {{"device", c.reference_device}, {"rows", c.reference_rows}, {"sampled", c.reference_sampled}}},
          {"replay_seconds", c.replay_seconds},
          {"replay_at_s", {{"began", number(c.replay_began_s)}, {"ended", number(c.replay_ended_s)}}},
          {"kernels", kernels}};
}

nlohmann::json report_to_json(const Report& report) {
  nlohmann::json calls = nlohmann::json::array();
  for (const auto& call : report.calls) calls.push_back(call_to_json(call));
  nlohmann::json json = {{"schema", "attnreplay.results"},
          {"schema_version", Report::kJsonSchemaVersion},
          {"tool_version", report.tool_version},
          {"argv", report.argv},
          {"started_utc", report.started_utc},
          {"environment", report.environment.values},
          {"stopping_rule", report.stopping_rule},
          {"units", {{"time", "s"}, {"tflops", "1e12 FLOP/s"}, {"gbytes_per_s", "1e9 B/s"}, {"arithmetic_intensity", "FLOP/B"}}},
          {"calls", calls},
          {"input_errors", report.input_errors},
          {"recorded_at_s", number(report.recorded_s)}};
  nlohmann::json compilations = nlohmann::json::array();
  for (const AheadCompilation& c : report.compilations_ahead) {
    compilations.push_back({{"kernel", c.kernel}, {"kind", c.kind}, {"seconds", number(c.seconds)}});
  }
  json["compilations_ahead"] = compilations;
  if (const auto& part = report.shard_part) {
    json["shard"] = {{"rank", part->shard.rank},
                     {"world_size", part->shard.world_size},
                     {"local_rank", part->shard.local_rank},
                     {"launcher", part->shard.launcher},
                     {"launch_id", part->shard.launch_id},
                     {"host", part->host},
                     {"run_calls", part->run_calls},
                     {"order", part->order}};
  }
  return json;
}

namespace {

// Schema-blind: the record as it is, indented.
class JsonPrinter final : public Printer {
 public:
  void print(const nlohmann::json& record, std::ostream& out) const override { out << record.dump(2) << '\n'; }
};

}  // namespace

const Printer& json_printer() {
  static const JsonPrinter printer;
  return printer;
}

}  // namespace attnreplay
