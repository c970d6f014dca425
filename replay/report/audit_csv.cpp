// The CSV of an audit record: fixed columns, one row per call and kernel, with the call's layer,
// step and input diagnostics, read from its JSON.
#include <nlohmann/json.hpp>

#include "replay/report/csv_rows.h"
#include "replay/report/printer.h"
#include "replay/report/records.h"

namespace attnreplay {
namespace {

const std::vector<CsvColumn>& audit_columns() {
  using F = CsvColumn::From;
  static const std::vector<CsvColumn> list = {
      {"source", "/source", F::call},
      {"call_index", "/call_index", F::call},
      {"op", "/op", F::call},
      {"layer", "/layer", F::call},
      {"step", "/step", F::call},
      {"batch", "/shape/batch", F::call},
      {"heads_q", "/shape/heads_q", F::call},
      {"heads_kv", "/shape/heads_kv", F::call},
      {"seq_q", "/shape/seq_q", F::call},
      {"seq_kv", "/shape/seq_kv", F::call},
      {"head_dim_qk", "/shape/head_dim_qk", F::call},
      {"head_dim_vo", "/shape/head_dim_vo", F::call},
      {"dtype", "/dtype", F::call},
      {"is_causal", "/is_causal", F::call},
      {"kernel", "/kernel", F::kernel},
      {"status", "/status", F::kernel},
      {"median_s", "/timing/median_s", F::kernel},
      {"tflops", "/tflops", F::kernel},
      {"rel_l2", "/error/rel_l2", F::kernel},
      {"cosine", "/error/cosine", F::kernel},
      {"max_abs", "/error/max_abs", F::kernel},
      {"mean_abs", "/error/mean_abs", F::kernel},
      {"rmse", "/error/rmse", F::kernel},
      {"rel_l1", "/error/rel_l1", F::kernel},
      {"nan_count", "/error/nan_count", F::kernel},
      {"inf_count", "/error/inf_count", F::kernel},
      {"refcheck_failures", "/refcheck_failures", F::kernel},
      {"k_mean_outlier_ratio", "/k_mean_outlier_ratio", F::diagnostics},
      {"k_mean_over_std", "/k_mean_over_std", F::diagnostics},
      {"q_amax_spread", "/q_amax_spread", F::diagnostics},
      {"k_amax_spread", "/k_amax_spread", F::diagnostics},
      {"k_smoothed_amax_spread", "/k_smoothed_amax_spread", F::diagnostics},
      {"reason", "/reason", F::kernel},
      {"rerun", "/rerun", F::kernel},
  };
  return list;
}

class AuditCsvPrinter final : public Printer {
 public:
  void print(const nlohmann::json& record, std::ostream& out) const override { write_csv_rows(record, audit_columns(), out); }
};

}  // namespace

const std::vector<std::string>& audit_csv_columns() {
  static const std::vector<std::string> names = column_names(audit_columns());
  return names;
}

const Printer& audit_csv_printer() {
  static const AuditCsvPrinter printer;
  return printer;
}

}  // namespace attnreplay
