// The printers (replay/report_*.cpp) on a Report built by hand: CSV columns and fields, the JSON
// record's schema and nulls for non-finite numbers, and what the table shows.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "replay/report/records.h"
#include "replay/report/printer.h"
#include "replay/run/replay_call.h"

using namespace attnreplay;
using Catch::Matchers::ContainsSubstring;

namespace {

// What a command does with a record: its JSON through the printer of a format.
template <class Record>
void results_printer(const char* format, const Record& record, std::ostream& out) {
  const nlohmann::json json = report_to_json(record);
  printer_for(format, json).print(json, out);
}

}  // namespace

namespace {

// One call, two kernels: one measured and compared, one that declined the call.
Report sample_report() {
  Report report;
  report.tool_version = "0.1.0";
  report.argv = {"attnreplay", "run", "calls.h5"};
  report.started_utc = "2025-01-01T00:00:00Z";
  report.environment.values = {{"cpu", "test cpu"}, {"cores", "2"}};
  report.stopping_rule = "stdrel";
  CallResult call;
  call.source = "calls.h5";
  call.call_index = 17;
  call.op = "aten::scaled_dot_product_attention";
  call.backend = "flash";
  call.shape = {2, 8, 2, 128, 256, 64, 64};
  call.dtype = "bfloat16";
  call.layout = Layout::bshd;
  call.is_causal = true;
  call.causal_alignment = CausalAlignment::bottom_right;
  call.mask = "none";
  call.scale = 0.125;
  call.work = attention_work(call.shape, true, call.causal_alignment, DType::bfloat16, DType::bfloat16);
  call.reference_rows = 128;
  call.notes = {"captured with dropout_p=0.1; replayed without dropout"};

  KernelResult measured;
  measured.kernel = "torch-math-cpu";
  measured.disposition = Disposition::passed;
  measured.work = call.work;
  measured.rerun = "attnreplay run calls.h5 --calls 17 --kernels torch-math-cpu";
  TimingSummary timing;
  timing.method = "cpu-steady-clock";
  timing.cache = "n/a";
  timing.samples = 12;
  timing.discarded = 1;
  timing.median_s = 0.002;
  timing.min_s = 0.0015;
  timing.max_s = 0.004;
  timing.mean_s = 0.0025;
  timing.stdev_rel = 0.25;
  timing.stop_reason = "converged";
  measured.timing = timing;
  ErrorStats error;
  error.elements = 100;
  error.rows_compared = 128;
  error.max_abs = 0.0078125;
  error.rel_l2 = 0.001;
  error.cosine = 0.9999;
  error.rel_l1 = std::numeric_limits<double>::infinity();  // non-finite: must print as null/empty
  error.mean_abs = std::numeric_limits<double>::quiet_NaN();
  error.nan_count = 3;
  measured.error = error;

  KernelResult declined;
  declined.kernel = "flash-cuda";
  declined.disposition = Disposition::not_supported;
  declined.reason = "needs a CUDA device, none found";
  declined.work = call.work;
  declined.rerun = "attnreplay run calls.h5 --calls 17 --kernels flash-cuda";

  call.kernels = {measured, declined};
  report.calls.push_back(call);
  report.input_errors = {"broken.h5: call 3: field 'k': missing"};
  return report;
}

// RFC 4180 fields of one line: quotes protect commas, "" is a quote.
std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') fields.back() += '"', ++i;
      else if (c == '"') quoted = false;
      else fields.back() += c;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.emplace_back();
    } else {
      fields.back() += c;
    }
  }
  return fields;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::size_t column(const std::string& name) {
  const auto& columns = csv_columns();
  const auto found = std::find(columns.begin(), columns.end(), name);
  REQUIRE(found != columns.end());
  return static_cast<std::size_t>(found - columns.begin());
}

}  // namespace

TEST_CASE("report csv: header is csv_columns(), one row per kernel with every field") {
  std::ostringstream out;
  results_printer("csv", sample_report(), out);
  const std::vector<std::string> lines = lines_of(out.str());
  REQUIRE(lines.size() == 3);
  std::string header;
  for (const auto& name : csv_columns()) header += (header.empty() ? "" : ",") + name;
  CHECK(lines[0] == header);

  const auto measured = split_csv_line(lines[1]);
  const auto declined = split_csv_line(lines[2]);
  REQUIRE(measured.size() == csv_columns().size());
  REQUIRE(declined.size() == csv_columns().size());

  CHECK(measured[column("source")] == "calls.h5");
  CHECK(measured[column("call_index")] == "17");
  CHECK(measured[column("heads_kv")] == "2");
  CHECK(measured[column("layout")] == "bshd");
  CHECK(measured[column("causal_alignment")] == "bottom_right");
  CHECK(measured[column("kernel")] == "torch-math-cpu");
  CHECK(measured[column("status")] == "passed");
  CHECK(measured[column("median_s")] == "0.002");
  CHECK(measured[column("samples")] == "12");
  CHECK(measured[column("discarded_samples")] == "1");
  CHECK(measured[column("sm_clock_mhz")].empty());  // a CPU kernel: no clock measured
  CHECK(measured[column("nan_count")] == "3");
  CHECK(measured[column("rel_l1")].empty());    // infinity
  CHECK(measured[column("mean_abs")].empty());  // NaN
  CHECK(measured[column("tflops")] == nlohmann::json(sample_report().calls[0].kernels[0].tflops()).dump());

  CHECK(declined[column("kernel")] == "flash-cuda");
  CHECK(declined[column("status")] == "not_supported");
  CHECK(declined[column("reason")] == "needs a CUDA device, none found");  // quoted: it has a comma
  CHECK(declined[column("median_s")].empty());
  CHECK(declined[column("cosine")].empty());
  CHECK(declined[column("call_index")] == "17");  // call columns repeat on every kernel's row
}

TEST_CASE("report csv: quotes inside fields are doubled") {
  Report report = sample_report();
  report.calls[0].kernels[1].reason = "said \"no\", twice";
  std::ostringstream out;
  results_printer("csv", report, out);
  const auto lines = lines_of(out.str());
  REQUIRE(lines.size() == 3);
  CHECK_THAT(lines[2], ContainsSubstring("\"said \"\"no\"\", twice\""));
  CHECK(split_csv_line(lines[2])[column("reason")] == "said \"no\", twice");
}

TEST_CASE("report json: schema, version, and null for non-finite numbers") {
  const nlohmann::json json = report_to_json(sample_report());
  CHECK(json.at("schema") == "attnreplay.results");
  CHECK(json.at("schema_version") == 3);
  CHECK(json.at("tool_version") == "0.1.0");
  CHECK(json.at("input_errors").size() == 1);
  REQUIRE(json.at("calls").size() == 1);
  const auto& call = json.at("calls")[0];
  CHECK(call.at("call_index") == 17);
  CHECK(call.at("shape").at("seq_kv") == 256);
  CHECK(call.at("scale") == 0.125);
  REQUIRE(call.at("kernels").size() == 2);
  const auto& measured = call.at("kernels")[0];
  CHECK(measured.at("status") == "passed");
  CHECK(measured.at("timing").at("median_s") == 0.002);
  CHECK(measured.at("timing").at("stop_reason") == "converged");
  CHECK(measured.at("error").at("rel_l1").is_null());
  CHECK(measured.at("error").at("mean_abs").is_null());
  CHECK(measured.at("error").at("max_abs") == 0.0078125);
  const auto& declined = call.at("kernels")[1];
  CHECK(declined.at("status") == "not_supported");
  CHECK(declined.at("reason") == "needs a CUDA device, none found");
  CHECK_FALSE(declined.contains("timing"));
  CHECK_FALSE(declined.contains("error"));

  // A non-finite call scale is null too, and the written text is strict JSON (no NaN tokens).
  Report report = sample_report();
  report.calls[0].scale = std::numeric_limits<double>::quiet_NaN();
  report.calls[0].kernels[0].timing->stdev_rel = std::numeric_limits<double>::infinity();
  std::ostringstream out;
  results_printer("json", report, out);
  const nlohmann::json parsed = nlohmann::json::parse(out.str());
  CHECK(parsed.at("calls")[0].at("scale").is_null());
  CHECK(parsed.at("calls")[0].at("kernels")[0].at("timing").at("stdev_rel").is_null());
  CHECK(out.str().find("NaN") == std::string::npos);
  CHECK(out.str().find("Infinity") == std::string::npos);
}

TEST_CASE("report json: each call records the quantized kernels' options") {
  Report report = sample_report();
  report.calls[0].quant_options.quant_gran = QuantGranularity::per_thread;
  report.calls[0].quant_options.k_smooth = false;
  report.calls[0].quant_options.pv_accum = PvAccum::fp32_fp16;
  const nlohmann::json options = report_to_json(report).at("calls")[0].at("quant_options");
  CHECK(options.at("quant_gran") == "per_thread");
  CHECK(options.at("k_smooth") == false);
  CHECK(options.at("pv_accum_dtype") == "fp32+fp16");
  CHECK(options.at("fp8_scale") == "per_head");
}

TEST_CASE("report table: each kernel, its status, the reason and notes are shown") {
  std::ostringstream out;
  results_printer("table", sample_report(), out);
  const std::string text = out.str();
  CHECK_THAT(text, ContainsSubstring("calls.h5: call 17"));
  CHECK_THAT(text, ContainsSubstring("torch-math-cpu"));
  CHECK_THAT(text, ContainsSubstring("flash-cuda"));
  CHECK_THAT(text, ContainsSubstring("not_supported"));
  CHECK_THAT(text, ContainsSubstring("flash-cuda: needs a CUDA device, none found"));
  CHECK_THAT(text, ContainsSubstring("torch-math-cpu: 3 NaN, 0 Inf in the output"));
  CHECK_THAT(text, ContainsSubstring("note: captured with dropout_p=0.1"));
  CHECK_THAT(text, ContainsSubstring("causal bottom_right"));
  CHECK_THAT(text, ContainsSubstring("error: broken.h5: call 3: field 'k': missing"));
  // The measured row shows the median in ms and the cosine to 8 places.
  const auto lines = lines_of(text);
  const auto row = std::find_if(lines.begin(), lines.end(), [](const std::string& line) {
    return line.find("torch-math-cpu") != std::string::npos && line.find("passed") != std::string::npos;
  });
  REQUIRE(row != lines.end());
  CHECK_THAT(*row, ContainsSubstring(" 2 "));
  CHECK_THAT(*row, ContainsSubstring("1-0.0001"));
  // The declined row has dashes where numbers would be.
  const auto declined = std::find_if(lines.begin(), lines.end(), [](const std::string& line) {
    return line.find("flash-cuda") != std::string::npos && line.find("not_supported") != std::string::npos;
  });
  REQUIRE(declined != lines.end());
  CHECK_THAT(*declined, ContainsSubstring(" - "));
}

TEST_CASE("report: the SM clock of a GPU kernel's samples in the JSON, the CSV and the table") {
  Report report = sample_report();
  TimingSummary& timing = *report.calls[0].kernels[0].timing;
  timing.method = "cuda-event";
  timing.cache = "cold-l2";
  timing.sm_clock_median_mhz = 1605;
  timing.sm_clock_min_mhz = 1335;
  timing.sm_clock_max_mhz = 1980;
  const nlohmann::json json = report_to_json(report);
  const auto& json_timing = json.at("calls")[0].at("kernels")[0].at("timing");
  CHECK(json_timing.at("sm_clock_median_mhz") == 1605.0);
  CHECK(json_timing.at("sm_clock_min_mhz") == 1335.0);
  CHECK(json_timing.at("sm_clock_max_mhz") == 1980.0);
  // Unmeasured (CPU) clocks are null, not 0.
  CHECK(report_to_json(sample_report()).at("calls")[0].at("kernels")[0].at("timing").at("sm_clock_median_mhz").is_null());

  std::ostringstream csv;
  results_printer("csv", report, csv);
  CHECK(split_csv_line(lines_of(csv.str())[1])[column("sm_clock_mhz")] == "1605.0");

  std::ostringstream table;
  results_printer("table", report, table);
  const auto lines = lines_of(table.str());
  const auto header = std::find_if(lines.begin(), lines.end(), [](const std::string& l) { return l.find("median ms") != std::string::npos; });
  const auto row = std::find_if(lines.begin(), lines.end(), [](const std::string& l) { return l.find("torch-math-cpu") != std::string::npos; });
  REQUIRE(header != lines.end());
  REQUIRE(row != lines.end());
  // The clock is the field under the MHz heading ("median ms" is one field of the row, two words).
  const auto words = [](const std::string& line) {
    std::vector<std::string> out;
    std::istringstream in(line);
    for (std::string word; in >> word;) out.push_back(word);
    return out;
  };
  const auto heading = words(*header);
  const auto fields = words(*row);
  const auto mhz = std::find(heading.begin(), heading.end(), "MHz");
  REQUIRE(mhz != heading.end());
  const auto at = static_cast<std::size_t>(mhz - heading.begin()) - 1;
  REQUIRE(at < fields.size());
  CHECK(fields[at] == "1605");
}

TEST_CASE("report: a library's call as the headline, the kernel alone beside it, labelled everywhere") {
  Report report = sample_report();
  KernelResult& kernel = report.calls[0].kernels[0];
  TimingSummary alone = *kernel.timing;
  alone.median_s = 0.0015;
  kernel.timing_kernel_alone = alone;  // timed stays "call": `timing` is the whole call
  const nlohmann::json json = report_to_json(report).at("calls")[0].at("kernels")[0];
  CHECK(json.at("timed") == "call");
  CHECK(json.at("timing_kernel_alone").at("median_s") == 0.0015);
  std::ostringstream csv;
  results_printer("csv", report, csv);
  const auto fields = split_csv_line(lines_of(csv.str())[1]);
  CHECK(fields[column("timed")] == "call");
  CHECK_THAT(std::stod(fields[column("median_s_kernel_alone")]), Catch::Matchers::WithinRel(0.0015, 1e-9));
  std::ostringstream table;
  results_printer("table", report, table);
  CHECK_THAT(table.str(), ContainsSubstring("1.5 ms the kernel alone, without the input preparation the call does"));
  const auto lines = lines_of(table.str());
  const auto row = std::find_if(lines.begin(), lines.end(), [](const std::string& l) { return l.find("torch-math-cpu ") == 2; });
  REQUIRE(row != lines.end());
  CHECK(row->find(" call ") != std::string::npos);
  CHECK(row->size() <= 120);
}

TEST_CASE("report: a preparation's time beside its bound at the copy ceiling") {
  Report report = sample_report();
  KernelResult& kernel = report.calls[0].kernels[0];
  TimingSummary with_preparation = *kernel.timing;
  with_preparation.median_s = 0.0026;  // 0.6 ms of preparation on a 2 ms kernel
  kernel.timed = "kernel";  // the kernel alone is the headline, the whole call beside it
  kernel.timing_with_preparation = with_preparation;
  TimingSummary of_preparation = *kernel.timing;
  of_preparation.median_s = 0.0006;  // its own figure, not the difference of the other two
  kernel.timing_of_preparation = of_preparation;
  kernel.preparation = KernelResult::PreparationBound{300e6, 0.0001};  // 300 MB at 3 TB/s
  const nlohmann::json json = report_to_json(report).at("calls")[0].at("kernels")[0].at("preparation");
  CHECK(json.at("bytes") == 300e6);
  CHECK(json.at("bound_s") == 0.0001);
  CHECK_THAT(json.at("time_s").get<double>(), Catch::Matchers::WithinRel(0.0006, 1e-9));
  CHECK_THAT(json.at("ratio_to_bound").get<double>(), Catch::Matchers::WithinRel(6.0, 1e-9));
  std::ostringstream table;
  results_printer("table", report, table);
  CHECK(table.str().find("2.6 ms the whole call, with its input preparation (preparation alone 0.6 ms, 6.00x its bound: "
                         "300 MB at the copy ceiling, 0.1 ms)") != std::string::npos);
  CHECK(table.str().find(" kernel ") != std::string::npos);  // the row says what its time covers
  // Without a measured ceiling there is no bound, and no ratio.
  kernel.preparation->bound_s = 0;
  CHECK(report_to_json(report).at("calls")[0].at("kernels")[0].at("preparation").at("ratio_to_bound").is_null());
}

TEST_CASE("report: a timing whose every sample was discarded shows no time, and the notes say why") {
  // A throttled GPU: every sample ran under 75 % of the rated clock. No figure may read 0 ms.
  Report report = sample_report();
  KernelResult& kernel = report.calls[0].kernels[0];
  TimingSummary untimed = summarize_samples({});
  untimed.method = "cuda-event";
  untimed.cache = "cold-l2";
  untimed.discarded = 40;
  untimed.stop_reason = "timeout";
  untimed.sm_clock_median_mhz = 1005;
  kernel.timing = untimed;
  kernel.timed = "kernel";
  kernel.timing_with_preparation = untimed;
  kernel.timing_of_preparation = untimed;
  kernel.preparation = KernelResult::PreparationBound{300e6, 0.0001};
  CHECK(std::isnan(kernel.tflops()));
  CHECK_FALSE(kernel.preparation_s());
  CHECK_FALSE(kernel.preparation_ratio());

  const auto note = untimed_note(kernel);
  REQUIRE(note);
  CHECK_THAT(*note, ContainsSubstring("torch-math-cpu (alone, with its input preparation, its input preparation alone): "
                                      "not timed: the cuda-event timer discarded all 40 samples"));
  CHECK_THAT(*note, ContainsSubstring("1005 MHz"));
  CHECK_FALSE(untimed_note(sample_report().calls[0].kernels[0]));  // timed: no note
  report.calls[0].notes.push_back(*note);

  const nlohmann::json json = report_to_json(report).at("calls")[0].at("kernels")[0];
  CHECK(json.at("timing").at("samples") == 0);
  CHECK(json.at("timing").at("discarded_samples") == 40);
  CHECK(json.at("timing").at("median_s").is_null());
  CHECK(json.at("tflops").is_null());
  CHECK(json.at("timing_with_preparation").at("median_s").is_null());
  CHECK(json.at("preparation").at("time_s").is_null());
  CHECK(json.at("preparation").at("ratio_to_bound").is_null());

  std::ostringstream csv;
  results_printer("csv", report, csv);
  const auto fields = split_csv_line(lines_of(csv.str())[1]);
  CHECK(fields[column("median_s")].empty());
  CHECK(fields[column("tflops")].empty());
  CHECK(fields[column("discarded_samples")] == "40");

  std::ostringstream table;
  results_printer("table", report, table);
  const std::string text = table.str();
  CHECK(text.find("nan") == std::string::npos);
  CHECK(text.find("with its input preparation (") == std::string::npos);  // no made-up whole-call time
  CHECK_THAT(text, ContainsSubstring("note: torch-math-cpu (alone, with its input preparation, its input preparation "
                                     "alone): not timed"));
  const auto lines = lines_of(text);
  const auto row = std::find_if(lines.begin(), lines.end(), [](const std::string& line) {
    return line.find("torch-math-cpu") != std::string::npos && line.find("passed") != std::string::npos;
  });
  REQUIRE(row != lines.end());
  CHECK_THAT(*row, ContainsSubstring(" - "));
  CHECK(row->find(" 0 ") == std::string::npos);
}
