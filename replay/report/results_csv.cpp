// The CSV of a results record: fixed columns, one row per call and kernel, read from its JSON.
#include <nlohmann/json.hpp>

#include "replay/report/csv_rows.h"
#include "replay/report/printer.h"
#include "replay/report/records.h"

namespace attnreplay {
namespace {

const std::vector<CsvColumn>& result_columns() {
  using F = CsvColumn::From;
  static const std::vector<CsvColumn> list = {
      {"source", "/source", F::call},
      {"call_index", "/call_index", F::call},
      {"case_tag", "/case_tag", F::call},
      {"op", "/op", F::call},
      {"backend", "/backend", F::call},
      {"batch", "/shape/batch", F::call},
      {"heads_q", "/shape/heads_q", F::call},
      {"heads_kv", "/shape/heads_kv", F::call},
      {"seq_q", "/shape/seq_q", F::call},
      {"seq_kv", "/shape/seq_kv", F::call},
      {"head_dim_qk", "/shape/head_dim_qk", F::call},
      {"head_dim_vo", "/shape/head_dim_vo", F::call},
      {"dtype", "/dtype", F::call},
      {"layout", "/layout", F::call},
      {"is_causal", "/is_causal", F::call},
      {"causal_alignment", "/causal_alignment", F::call},
      {"mask", "/mask", F::call},
      {"mask_structure", "/mask_structure", F::call},
      {"batching", "/batching", F::call},
      {"scale", "/scale", F::call},
      {"flops", "/work/flops", F::call},
      {"bytes", "/work/bytes", F::call},
      {"arithmetic_intensity", "/work/arithmetic_intensity", F::call},
      {"kernel", "/kernel", F::kernel},
      {"status", "/status", F::kernel},
      {"reason", "/reason", F::kernel},
      {"time_method", "/timing/method", F::kernel},
      {"cache", "/timing/cache", F::kernel},
      {"timed", "/timed", F::kernel},
      {"median_s", "/timing/median_s", F::kernel},
      {"min_s", "/timing/min_s", F::kernel},
      {"max_s", "/timing/max_s", F::kernel},
      {"stdev_rel", "/timing/stdev_rel", F::kernel},
      {"spread_rel", "/timing/spread_rel", F::kernel},
      {"median_ci_low_s", "/timing/median_ci_low_s", F::kernel},
      {"median_ci_high_s", "/timing/median_ci_high_s", F::kernel},
      {"median_s_with_preparation", "/timing_with_preparation/median_s", F::kernel},
      {"median_s_kernel_alone", "/timing_kernel_alone/median_s", F::kernel},
      {"preparation_median_s", "/timing_of_preparation/median_s", F::kernel},
      {"preparation_ratio_to_bound", "/preparation/ratio_to_bound", F::kernel},
      {"samples", "/timing/samples", F::kernel},
      {"discarded_samples", "/timing/discarded_samples", F::kernel},
      {"sm_clock_mhz", "/timing/sm_clock_median_mhz", F::kernel},
      {"power_w", "/timing/power_median_w", F::kernel},
      {"tflops", "/tflops", F::kernel},
      {"gbytes_per_s", "/gbytes_per_s", F::kernel},
      {"matrix_ceiling_fraction", "/matrix_ceiling_fraction", F::kernel},
      {"copy_ceiling_fraction", "/copy_ceiling_fraction", F::kernel},
      {"max_abs", "/error/max_abs", F::kernel},
      {"mean_abs", "/error/mean_abs", F::kernel},
      {"mse", "/error/mse", F::kernel},
      {"rmse", "/error/rmse", F::kernel},
      {"std_abs", "/error/std_abs", F::kernel},
      {"rel_l1", "/error/rel_l1", F::kernel},
      {"rel_l2", "/error/rel_l2", F::kernel},
      {"cosine", "/error/cosine", F::kernel},
      {"nan_count", "/error/nan_count", F::kernel},
      {"inf_count", "/error/inf_count", F::kernel},
      {"rows_compared", "/error/rows_compared", F::kernel},
      {"sampled", "/error/sampled", F::kernel},
      {"rerun", "/rerun", F::kernel},
  };
  return list;
}

class ResultsCsvPrinter final : public Printer {
 public:
  void print(const nlohmann::json& record, std::ostream& out) const override { write_csv_rows(record, result_columns(), out); }
};

}  // namespace

const std::vector<std::string>& csv_columns() {
  static const std::vector<std::string> names = column_names(result_columns());
  return names;
}

const Printer& results_csv_printer() {
  static const ResultsCsvPrinter printer;
  return printer;
}

}  // namespace attnreplay
