// The console table of an audit record, read from its JSON: the verdict per kernel, the spread of
// each error statistic over the calls, the worst calls with their worst heads (and, with
// --attribute, the error step by step), and the captured calls beside random ones of their shapes.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>

#include "replay/report/json_values.h"
#include "replay/report/number_format.h"
#include "replay/report/printer.h"
#include "replay/report/records.h"

namespace attnreplay {
namespace {

std::string statistic_text(const std::string& statistic, double value) {
  return statistic == "cosine" ? cosine_text(value) : figure(value);
}

// A layer or step as the JSON holds it (a number, a text, or null when the call has none).
std::string metadata_text(const nlohmann::json& value) {
  if (value.is_null()) return "-";
  return value.is_string() ? value.get<std::string>() : value.dump();
}

std::string count(std::size_t n, std::string_view noun) { return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s"); }

void print_verdicts(const nlohmann::json& record, std::ostream& out) {
  const auto& options = record.at("options");
  out << fmt::format("audit: {} in {}, {}; errors against the fp64 reference{}\n\n",
                     count(record.at("calls").size(), "call"), count(record.at("shapes").size(), "shape"),
                     count(record.at("kernels").size(), "kernel"),
                     options.at("cast_inputs").is_null()
                         ? ""
                         : fmt::format(", inputs cast to {}", options.at("cast_inputs").get<std::string>()));
  constexpr const char* kRow = "{:<20} {:<8} {:>6} {:>6} {:>6} {:>6} {:>11} {:>9}  {}\n";
  out << fmt::format(kRow, "kernel", "verdict", "calls", "fail", "error", "n/s", "median ms", "TFLOP/s", "thresholds");
  for (const auto& k : record.at("kernels")) {
    out << fmt::format(kRow, k.at("kernel").get<std::string>(), k.at("verdict").get<std::string>(),
                       k.at("calls_judged").get<std::int64_t>(), k.at("calls_failing").get<std::int64_t>(),
                       k.at("calls_errored").get<std::int64_t>(), k.at("calls_not_supported").get<std::int64_t>(),
                       figure(number_at(k.at("median_time_s"), "median") * 1e3, 4),
                       figure(number_at(k.at("tflops"), "median"), 4),
                       fmt::join(k.at("thresholds").get<std::vector<std::string>>(), "; "));
  }
  out << "  (calls: ran and judged; fail: over a threshold; error: the kernel threw; n/s: not supported;\n"
         "   median ms and TFLOP/s: the median over calls of each call's median)\n";
  for (const auto& k : record.at("kernels")) {
    for (const auto& reason : k.at("not_supported_reasons")) {
      out << fmt::format("  {} declined: {}\n", k.at("kernel").get<std::string>(), reason.get<std::string>());
    }
  }
  out << '\n';
}

void print_distributions(const nlohmann::json& record, std::ostream& out) {
  constexpr const char* kRow = "{:<20} {:<10} {:>12} {:>12} {:>12} {:>12}\n";
  out << fmt::format(kRow, "kernel", "statistic", "min", "median", "p99", "max");
  for (const auto& k : record.at("kernels")) {
    bool first = true;
    for (const auto& name : record.at("statistics")) {
      const std::string statistic = name.get<std::string>();
      const auto& d = k.at("errors").at(statistic);
      if (d.at("count").get<std::int64_t>() == 0) continue;
      out << fmt::format(kRow, first ? k.at("kernel").get<std::string>() : "", statistic,
                         statistic_text(statistic, number_at(d, "min")), statistic_text(statistic, number_at(d, "median")),
                         statistic_text(statistic, number_at(d, "p99")), statistic_text(statistic, number_at(d, "max")));
      first = false;
    }
  }
  out << '\n';
}

std::string describe_diagnostics(const nlohmann::json& d) {
  const auto& outlier = d.at("k_outlier");
  return fmt::format("K mean outlier {}x (channel std {}x) at b{} h{} c{}; INT8 amax spread Q {}x, K {}x, "
                     "smoothed K {}x",
                     figure(number_at(d, "k_mean_outlier_ratio")), figure(number_at(d, "k_mean_over_std")),
                     outlier.at("batch").get<std::int64_t>(), outlier.at("head").get<std::int64_t>(),
                     outlier.at("channel").get<std::int64_t>(), figure(number_at(d, "q_amax_spread")),
                     figure(number_at(d, "k_amax_spread")), figure(number_at(d, "k_smoothed_amax_spread")));
}

// The three worst (batch, head) of a call: "0,3 0.012; ...". A head whose figure is NaN (its
// reference is not finite) comes first: nothing can be told of it.
std::string worst_heads(const nlohmann::json& per_head) {
  std::vector<nlohmann::json> heads(per_head.begin(), per_head.end());
  std::stable_sort(heads.begin(), heads.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
    const double x = number_at(a, "rel_l2"), y = number_at(b, "rel_l2");
    if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && !std::isnan(y);
    return x > y;
  });
  std::vector<std::string> texts;
  for (std::size_t i = 0; i < heads.size() && i < 3; ++i) {
    texts.push_back(fmt::format("{},{} {}", heads[i].at("batch").get<std::int64_t>(),
                                heads[i].at("head").get<std::int64_t>(), figure(number_at(heads[i], "rel_l2"))));
  }
  return fmt::format("{}", fmt::join(texts, "; "));
}

void print_worst_call(const nlohmann::json& record, const nlohmann::json& worst, std::ostream& out) {
  const nlohmann::json& call = record.at("calls").at(worst.at("call").get<std::size_t>());
  const auto error = worst.find("error");
  const bool has_error = error != worst.end();
  const std::string op = worst.at("op").get<std::string>();
  out << fmt::format("  {:>6}  {:<34} {:>5} {:>5} {:>10} {:>12} {:>10}\n", worst.at("call_index").get<std::int64_t>(),
                     op.empty() ? "-" : op, metadata_text(worst.at("layer")), metadata_text(worst.at("step")),
                     has_error ? figure(number_at(*error, "rel_l2")) : "-",
                     has_error ? cosine_text(number_at(*error, "cosine")) : "-",
                     has_error ? figure(number_at(*error, "max_abs")) : "-");
  out << fmt::format("          worst heads (b,h rel_l2): {}\n", worst_heads(worst.at("per_head")));
  const auto stages = worst.find("attribution");
  if (stages != worst.end() && !stages->empty()) {
    std::vector<std::string> texts;
    for (const auto& stage : *stages) {
      texts.push_back(fmt::format("{} {}", stage.at("stages").get<std::string>(), figure(number_at(stage, "rel_l2"))));
    }
    out << fmt::format("          rel_l2 with quantization steps on: {}\n", fmt::join(texts, ", "));
  } else if (worst.contains("attribution_note")) {
    out << fmt::format("          {}\n", worst.at("attribution_note").get<std::string>());
  }
  if (call.contains("diagnostics")) out << fmt::format("          inputs: {}\n", describe_diagnostics(call.at("diagnostics")));
}

void print_worst_calls(const nlohmann::json& record, std::ostream& out) {
  const auto& kernels = record.at("kernels");
  if (std::none_of(kernels.begin(), kernels.end(), [](const nlohmann::json& k) { return !k.at("worst_calls").empty(); })) {
    return;
  }
  out << fmt::format("worst calls by rel_l2 (up to {} per kernel), with their three worst (batch, head)\n",
                     record.at("options").at("worst").get<int>());
  for (const auto& k : kernels) {
    if (k.at("worst_calls").empty()) continue;
    out << k.at("kernel").get<std::string>()
        << (k.contains("attribution_note") ? fmt::format(": {}", k.at("attribution_note").get<std::string>()) : "")
        << '\n';
    out << fmt::format("  {:>6}  {:<34} {:>5} {:>5} {:>10} {:>12} {:>10}\n", "call", "op", "layer", "step", "rel_l2",
                       "cosine", "max_abs");
    for (const auto& worst : k.at("worst_calls")) print_worst_call(record, worst, out);
  }
  out << '\n';
}

void print_random_comparison(const nlohmann::json& record, std::ostream& out) {
  out << fmt::format(
      "captured against random inputs: median rel_l2 over the captured calls of each shape, beside {} call(s) of\n"
      "standard normal inputs of that shape (seeds --seed and on): their median and range; ratio = captured over\n"
      "random median (> 1: the real tensors are harder than random ones); above/below: outside the random range\n",
      record.at("options").at("random_seeds").get<int>());
  // Each shape on a line of its own, its kernels below it: within 120 columns.
  constexpr const char* kRow = "    {:<20} {:>10} {:>10} {:>21} {:>8} {:>7}\n";
  for (const auto& group : record.at("shapes")) {
    out << fmt::format("  {}  {}{}  {}\n", shape_text(group.at("shape")), group.at("dtype").get<std::string>(),
                       group.at("is_causal").get<bool>() ? "  causal" : "", count(group.at("calls").size(), "call"));
    out << fmt::format(kRow, "kernel", "captured", "random", "random range", "ratio", "");
    for (const auto& summary : group.at("kernels")) {
      const nlohmann::json random = summary.value("random", nlohmann::json());
      const bool has_random = random.is_object();
      out << fmt::format(kRow, summary.at("kernel").get<std::string>(),
                         figure(number_at(summary, "median_rel_l2")), has_random ? figure(number_at(random, "rel_l2")) : "-",
                         has_random ? fmt::format("{} .. {}", figure(number_at(random, "rel_l2_min")),
                                                  figure(number_at(random, "rel_l2_max")))
                                    : "-",
                         figure(number_at(summary, "captured_over_random_rel_l2")),
                         has_random ? summary.at("captured_vs_random_range").get<std::string>() : "");
    }
  }
  out << '\n';
}

class AuditTablePrinter final : public Printer {
 public:
  void print(const nlohmann::json& record, std::ostream& out) const override {
    print_verdicts(record, out);
    print_distributions(record, out);
    print_worst_calls(record, out);
    if (record.at("options").at("random_compare").get<bool>()) print_random_comparison(record, out);
    for (const auto& error : record.at("input_errors")) out << "error: " << error.get<std::string>() << '\n';
  }
};

}  // namespace

const Printer& audit_table_printer() {
  static const AuditTablePrinter printer;
  return printer;
}

}  // namespace attnreplay
