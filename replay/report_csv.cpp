#include "replay/report.h"

namespace attnreplay {
namespace {

// Each column is a path into a call's JSON ("/shape/batch") or a kernel's ("kernel:/timing/median_s").
struct Column {
  std::string name;
  std::string pointer;
  bool from_kernel;
};

const std::vector<Column>& columns() {
  static const std::vector<Column> list = {
      {"source", "/source", false},
      {"call_index", "/call_index", false},
      {"case_tag", "/case_tag", false},
      {"op", "/op", false},
      {"backend", "/backend", false},
      {"batch", "/shape/batch", false},
      {"heads_q", "/shape/heads_q", false},
      {"heads_kv", "/shape/heads_kv", false},
      {"seq_q", "/shape/seq_q", false},
      {"seq_kv", "/shape/seq_kv", false},
      {"head_dim_qk", "/shape/head_dim_qk", false},
      {"head_dim_vo", "/shape/head_dim_vo", false},
      {"dtype", "/dtype", false},
      {"layout", "/layout", false},
      {"is_causal", "/is_causal", false},
      {"causal_alignment", "/causal_alignment", false},
      {"mask", "/mask", false},
      {"batching", "/batching", false},
      {"scale", "/scale", false},
      {"flops", "/work/flops", false},
      {"bytes", "/work/bytes", false},
      {"arithmetic_intensity", "/work/arithmetic_intensity", false},
      {"kernel", "/kernel", true},
      {"status", "/status", true},
      {"reason", "/reason", true},
      {"time_method", "/timing/method", true},
      {"cache", "/timing/cache", true},
      {"median_s", "/timing/median_s", true},
      {"min_s", "/timing/min_s", true},
      {"max_s", "/timing/max_s", true},
      {"stdev_rel", "/timing/stdev_rel", true},
      {"spread_rel", "/timing/spread_rel", true},
      {"median_s_with_preparation", "/timing_with_preparation/median_s", true},
      {"preparation_median_s", "/timing_of_preparation/median_s", true},
      {"preparation_ratio_to_bound", "/preparation/ratio_to_bound", true},
      {"samples", "/timing/samples", true},
      {"discarded_samples", "/timing/discarded_samples", true},
      {"sm_clock_mhz", "/timing/sm_clock_median_mhz", true},
      {"power_w", "/timing/power_median_w", true},
      {"tflops", "/tflops", true},
      {"gbytes_per_s", "/gbytes_per_s", true},
      {"matrix_ceiling_fraction", "/matrix_ceiling_fraction", true},
      {"copy_ceiling_fraction", "/copy_ceiling_fraction", true},
      {"max_abs", "/error/max_abs", true},
      {"mean_abs", "/error/mean_abs", true},
      {"mse", "/error/mse", true},
      {"rmse", "/error/rmse", true},
      {"std_abs", "/error/std_abs", true},
      {"rel_l1", "/error/rel_l1", true},
      {"rel_l2", "/error/rel_l2", true},
      {"cosine", "/error/cosine", true},
      {"nan_count", "/error/nan_count", true},
      {"inf_count", "/error/inf_count", true},
      {"rows_compared", "/error/rows_compared", true},
      {"sampled", "/error/sampled", true},
      {"rerun", "/rerun", true},
  };
  return list;
}

}  // namespace

std::string csv_field(const nlohmann::json& value) {
  if (value.is_null()) return "";
  std::string text = value.is_string() ? value.get<std::string>() : value.dump();
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + '"';
}

const std::vector<std::string>& csv_columns() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& column : columns()) out.push_back(column.name);
    return out;
  }();
  return names;
}

void write_csv(const Report& report, std::ostream& out) { write_csv(report_to_json(report), out); }

void write_csv(const nlohmann::json& json, std::ostream& out) {
  out << fmt::format("{}\n", fmt::join(csv_columns(), ","));
  for (const auto& call : json["calls"]) {
    for (const auto& kernel : call["kernels"]) {
      std::vector<std::string> fields;
      for (const auto& column : columns()) {
        const nlohmann::json& from = column.from_kernel ? kernel : call;
        const nlohmann::json::json_pointer pointer(column.pointer);
        fields.push_back(from.contains(pointer) ? csv_field(from.at(pointer)) : "");
      }
      out << fmt::format("{}\n", fmt::join(fields, ","));
    }
  }
}

}  // namespace attnreplay
