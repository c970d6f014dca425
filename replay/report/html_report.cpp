#include "replay/report/html_report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <ostream>
#include <string>

#include "formats/errors.h"
#include "replay/judge/kernel_summary.h"
#include "replay/report/json_values.h"
#include "replay/report/printer.h"
#include "replay/report/records.h"

namespace attnreplay {

// The page's script and style (replay/report/html/), built into the program (html_assets.cpp.in).
extern const char* const kReportScript;
extern const char* const kReportStyle;

namespace {

nlohmann::json median_of(const nlohmann::json& k, const char* timing_key) {
  const auto timing = k.find(timing_key);
  if (timing == k.end() || !timing->is_object()) return nullptr;
  const double median = number_at(*timing, "median_s");
  return median > 0 ? nlohmann::json(median) : nlohmann::json();
}

// A call's layer or step: the audit's own field, else the capture's metadata; null when neither.
nlohmann::json call_position(const nlohmann::json& call, const char* key) {
  if (const auto own = call.find(key); own != call.end() && own->is_number_integer()) return *own;
  if (const auto metadata = call.find("metadata"); metadata != call.end() && metadata->is_object()) {
    const std::string text = metadata->value(key, std::string());
    if (!text.empty() && text.size() <= 18 && text.find_first_not_of("0123456789") == std::string::npos) {
      return std::stoll(text);
    }
  }
  return nullptr;
}

nlohmann::json kernel_row(const nlohmann::json& call, const nlohmann::json& k) {
  nlohmann::json row;
  row["call"] = call_name(call);
  row["source"] = std::filesystem::path(text_at(call, "source")).filename().string();
  row["call_index"] = call.value("call_index", -1);
  row["layer"] = call_position(call, "layer");
  row["step"] = call_position(call, "step");
  row["shape"] = call.contains("shape") ? shape_text(call.at("shape")) : "";
  row["dtype"] = text_at(call, "dtype");
  row["causal"] = call.value("is_causal", false);
  row["mask"] = text_at(call, "mask");
  row["kernel"] = text_at(k, "kernel");
  row["status"] = text_at(k, "status");
  row["reason"] = text_at(k, "reason");
  row["emulation"] = k.value("emulation", false);
  row["reduced_precision"] = text_at(k, "reduced_precision");
  // What each time covers: the whole call (with its input preparation, where there is one) and the
  // kernel alone; the page's speed-ups use the whole call. `timing` is whichever `timed` says.
  const nlohmann::json alone = median_of(k, "timing_kernel_alone");
  row["timed"] = text_at(k, "timed");
  const double call_s = call_time_s(k);
  row["call_s"] = call_s > 0 ? nlohmann::json(call_s) : nlohmann::json();
  row["kernel_s"] = alone.is_null() ? median_of(k, "timing") : alone;
  row["shared_from"] = text_at(k, "timing_shared_from");
  if (const auto work = call.find("work"); work != call.end()) {
    row["flops"] = json_number(number_at(*work, "flops"));
    row["bytes"] = json_number(number_at(*work, "bytes"));
  }
  row["tflops"] = json_number(number_at(k, "tflops"));
  row["gbytes_per_s"] = json_number(number_at(k, "gbytes_per_s"));
  if (const auto error = k.find("error"); error != k.end() && error->is_object()) {
    const nlohmann::json& judged = judged_figures(*error);
    for (const char* key : {"rel_l2", "cosine", "max_abs"}) row[key] = json_number(number_at(judged, key));
    // The whole call's, its undefined rows that see no key included, beside the judged figure.
    if (const auto whole = error->find("including_rows_without_a_key"); whole != error->end()) {
      row["rel_l2_every_row"] = json_number(number_at(*whole, "rel_l2"));
    }
    row["nonfinite"] = error->value("nan_count", 0ll) + error->value("inf_count", 0ll);
  }
  row["rerun"] = text_at(k, "rerun");
  return row;
}

nlohmann::json summary_json(const KernelSummary& summary) {
  nlohmann::json kernels = nlohmann::json::array(), refusals = nlohmann::json::array();
  for (const KernelStanding& k : summary.kernels) {
    kernels.push_back({{"kernel", k.name}, {"emulation", k.emulation}, {"exact", k.exact}, {"ran", k.ran},
                       {"refused", k.refused}, {"failed", k.failed}, {"timed", k.timed},
                       {"vs_baseline", json_number(k.vs_baseline)}, {"median_rel_l2", json_number(k.median_rel_l2)},
                       {"worst_rel_l2", json_number(k.worst_rel_l2)}, {"worst_call", k.worst_call}});
  }
  for (const Refusal& r : summary.refusals) refusals.push_back({{"reason", r.reason}, {"kernels", r.kernels}});
  return {{"calls", summary.calls}, {"baseline", summary.baseline}, {"baseline_note", summary.baseline_note},
          {"kernels", kernels}, {"refusals", refusals}};
}

// The GPU's measured ceilings, from the environment run records (ceiling_bf16_tflops, ...).
nlohmann::json ceilings_json(const nlohmann::json& environment) {
  nlohmann::json ceilings = nlohmann::json::object();
  for (const char* key : {"bf16_tflops", "fp8_tflops", "int8_tops", "copy_gbps"}) {
    const std::string text = environment.value(std::string("ceiling_") + key, std::string());
    char* end = nullptr;
    const double value = text.empty() ? 0 : std::strtod(text.c_str(), &end);
    if (value > 0) ceilings[key] = value;
  }
  return ceilings;
}

// JSON inside <script>: no "</script>" or "<!--" may appear, so every '<' is written escaped.
std::string script_safe(const std::string& json) {
  std::string out;
  out.reserve(json.size());
  for (const char c : json) {
    if (c == '<') out += "\\u003c";
    else out += c;
  }
  return out;
}

std::string html_escaped(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

class HtmlReportPrinter final : public Printer {
 public:
  void print(const nlohmann::json& record, std::ostream& out) const override {
    const nlohmann::json& options = record.value("options", nlohmann::json::object());
    std::string name = options.value("json", std::string());
    name = name.empty() ? record.value("started_utc", std::string("this run")) : std::filesystem::path(name).filename().string();
    const auto baseline = options.find("baseline");
    out << html_report({{name, &record}}, baseline != options.end() && baseline->is_string() ? baseline->get<std::string>() : "");
  }
};

}  // namespace

nlohmann::json report_page_data(const NamedRecord& named, const std::string& baseline) {
  const nlohmann::json& record = *named.record;
  const std::string schema = record.value("schema", std::string());
  if ((schema != "attnreplay.results" && schema != "attnreplay.audit") || !record.contains("calls") ||
      !record.at("calls").is_array()) {
    throw InputError(fmt::format("{}: not a run's or an audit's record (schema '{}'): give the --json of attnreplay "
                                 "run or audit", named.name, schema));
  }
  nlohmann::json page;
  page["name"] = named.name;
  page["schema"] = schema;
  page["tool_version"] = record.value("tool_version", std::string());
  page["started_utc"] = record.value("started_utc", std::string());
  page["stopping_rule"] = record.value("stopping_rule", std::string());
  std::string command;
  for (const auto& word : record.value("argv", nlohmann::json::array())) command += (command.empty() ? "" : " ") + word.get<std::string>();
  page["command"] = command;
  const nlohmann::json environment = record.value("environment", nlohmann::json::object());
  page["environment"] = environment;
  page["ceilings"] = ceilings_json(environment);
  page["summary"] = summary_json(summarize_kernels(record, baseline));
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& call : record.at("calls")) {
    for (const auto& k : call.at("kernels")) rows.push_back(kernel_row(call, k));
  }
  page["rows"] = std::move(rows);
  if (schema == "attnreplay.audit") {
    nlohmann::json verdicts = nlohmann::json::object();
    for (const auto& k : record.value("kernels", nlohmann::json::array())) verdicts[text_at(k, "kernel")] = text_at(k, "verdict");
    page["verdicts"] = verdicts;
  }
  page["input_errors"] = record.value("input_errors", nlohmann::json::array());
  return page;
}

std::string html_report(const std::vector<NamedRecord>& records, const std::string& baseline) {
  nlohmann::json pages = nlohmann::json::array();
  std::string title;
  for (const NamedRecord& record : records) {
    pages.push_back(report_page_data(record, baseline));
    title += (title.empty() ? "" : ", ") + record.name;
  }
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>attnreplay report: {}</title>\n<style>\n{}</style>\n</head>\n<body>\n"
      "<div id=\"report\"><noscript>This report draws its tables and charts with JavaScript.</noscript></div>\n"
      "<script type=\"application/json\" id=\"report-data\">{}</script>\n<script>\n{}</script>\n</body>\n</html>\n",
      html_escaped(title), kReportStyle, script_safe(pages.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)),
      kReportScript);
}

const Printer& html_report_printer() {
  static const HtmlReportPrinter printer;
  return printer;
}

}  // namespace attnreplay
