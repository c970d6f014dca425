// The console table of a results record, read from its JSON: per call its shape and work, a row
// per kernel (time, spread, rates, share of the GPU's ceilings, clock, errors), then footnotes.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "replay/judge/kernel_summary.h"
#include "replay/report/json_values.h"
#include "replay/report/number_format.h"
#include "replay/report/printer.h"
#include "replay/report/records.h"
#include "replay/report/text_wrap.h"

namespace attnreplay {
namespace {

bool timed(const nlohmann::json& timing) { return timing.is_object() && timing.value("samples", 0) > 0; }

void print_call_header(const nlohmann::json& call, std::ostream& out) {
  const std::string tag = text_at(call, "case_tag"), op = text_at(call, "op"), backend = text_at(call, "backend");
  std::vector<std::string> fields{fmt::format("{}{}: call {}", tag.empty() ? "" : "[" + tag + "] ",
                                              text_at(call, "source"), call.at("call_index").get<std::int64_t>())};
  if (!op.empty()) fields.push_back(op);
  if (!backend.empty()) fields.push_back("(" + backend + ")");
  fields.push_back(fmt::format("{} {}  {}", text_at(call, "dtype"), text_at(call, "layout"), shape_text(call.at("shape"))));
  const std::string structure = text_at(call, "mask_structure");
  fields.push_back("mask " + text_at(call, "mask") + (structure.empty() ? "" : " (" + structure + ")"));
  fields.push_back(fmt::format("scale {:.4g}", number_at(call, "scale")));
  // Lines after the first indented by four: the call's work line, below, is by two.
  out << wrap_fields(fields, "", "    ", "  ");
  const bool causal = call.value("is_causal", false);
  const std::string batching = text_at(call, "batching");
  const auto& extensions = call.at("extensions");
  const auto& work = call.at("work");
  const auto& reference = call.at("reference");
  out << fmt::format("  {}{}{}{}work {}, {}, {:.3g} FLOP/B{}\n", causal ? "causal " : "",
                     causal ? text_at(call, "causal_alignment") + "  " : std::string(),
                     batching.empty() ? "" : batching + "  ",
                     extensions.empty()
                         ? ""
                         : fmt::format("{}  ", fmt::join(extensions.get<std::vector<std::string>>(), ", ")),
                     si(number_at(work, "flops"), "FLOP"), si(number_at(work, "bytes"), "B"),
                     number_at(work, "arithmetic_intensity"),
                     reference.value("sampled", false)
                         ? fmt::format("  (errors on {} sampled query rows)", reference.at("rows").get<std::int64_t>())
                         : "");
}

// 120 columns. "timed": what the time covers, the whole "call" or the "kernel" alone.
constexpr const char* kRowFormat = "  {:<18} {:<13} {:<6} {:>10} {:>5} {:>8} {:>8} {:>5} {:>6} {:>9} {:>9} {:>10}\n";

void print_kernel_row(const nlohmann::json& k, std::ostream& out) {
  std::string time = "-", spread = "-", tflops = "-", gbps = "-", clock = "-", covers = "-";
  if (const auto timing = k.value("timing", nlohmann::json()); timed(timing)) {  // else the call's notes say why
    time = fmt::format("{:.4g}", number_at(timing, "median_s") * 1e3);
    covers = k.value("timed", std::string("call"));
    // The SM clock during the samples: at a power limit it sits well under the rated one.
    if (number_at(timing, "sm_clock_median_mhz") > 0) clock = fmt::format("{:.0f}", number_at(timing, "sm_clock_median_mhz"));
    spread = fmt::format("{:.2g}", number_at(timing, "spread_rel") * 100);
    tflops = g(number_at(k, "tflops"), 4);
    gbps = g(number_at(k, "gbytes_per_s"), 4);
  }
  std::string max_abs = "-", rel_l2 = "-", cosine = "-";
  if (const auto error = k.find("error"); error != k.end()) {
    max_abs = g(number_at(*error, "max_abs"));
    rel_l2 = g(number_at(*error, "rel_l2"));
    cosine = cosine_text(number_at(*error, "cosine"));
  }
  // The larger of the two fractions of this GPU's measured ceilings: what bounds the kernel.
  std::string peak = "-";
  if (k.contains("matrix_ceiling_fraction") || k.contains("copy_ceiling_fraction")) {
    const double matrix = k.value("matrix_ceiling_fraction", 0.0), copy = k.value("copy_ceiling_fraction", 0.0);
    peak = fmt::format("{:.0f}", 100 * std::max(matrix, copy));
  }
  out << fmt::format(kRowFormat, text_at(k, "kernel"), text_at(k, "status"), covers, time, spread, tflops, gbps, peak,
                     clock, max_abs, rel_l2, cosine);
}

// What a row's figures leave out: NaN outputs, rows without keys, timing methods other than the
// default, the whole call with its preparation, and why a kernel did not pass.
void add_footnotes(const nlohmann::json& k, std::vector<std::string>& footnotes) {
  const std::string name = text_at(k, "kernel");
  if (const auto error = k.find("error"); error != k.end()) {
    const auto nan = error->value("nan_count", 0ll), inf = error->value("inf_count", 0ll);
    if (nan || inf) footnotes.push_back(fmt::format("{}: {} NaN, {} Inf in the output", name, nan, inf));
    if (const auto whole = error->find("including_rows_without_a_key"); whole != error->end()) {
      const auto whole_nan = whole->value("nan_count", 0ll), whole_inf = whole->value("inf_count", 0ll);
      footnotes.push_back(fmt::format(
          "{}: figures over the rows that see a key; the whole call, its {} undefined rows that see none included: "
          "max_abs {}, rel_l2 {}, cosine {:.8f}{}",
          name, error->value("no_key_rows", 0ll), g(number_at(*whole, "max_abs")), g(number_at(*whole, "rel_l2")),
          number_at(*whole, "cosine"),
          whole_nan + whole_inf > 0 ? fmt::format(", {} NaN, {} Inf", whole_nan, whole_inf) : std::string()));
    }
  }
  // The default methods go without saying; the others are named beside their figures.
  if (const auto timing = k.find("timing"); timing != k.end()) {
    const std::string method = text_at(*timing, "method"), cache = text_at(*timing, "cache");
    const int runs = timing->value("runs_per_sample", 1);
    if (method != "cpu-steady-clock" && (method != "cuda-event" || cache != "cold-l2")) {
      footnotes.push_back(fmt::format("{}: timed by {}, {}{}", name, method, cache,
                                      runs > 1 ? fmt::format(", {} runs per sample", runs) : std::string()));
    }
  }
  if (const auto whole = k.find("timing_with_preparation"); whole != k.end() && timed(*whole)) {
    // The preparation's own time beside moving its bytes at the copy ceiling, where measured.
    std::string bound;
    if (const auto preparation = k.find("preparation"); preparation != k.end() && number_at(*preparation, "ratio_to_bound") > 0) {
      bound = fmt::format(" (preparation alone {:.4g} ms, {:.2f}x its bound: {} at the copy ceiling, {:.4g} ms)",
                          number_at(*preparation, "time_s") * 1e3, number_at(*preparation, "ratio_to_bound"),
                          si(number_at(*preparation, "bytes"), "B"), number_at(*preparation, "bound_s") * 1e3);
    }
    // Beside a library's call, the preparation is work outside that call (KernelDescription::Headline).
    const bool kernel_alone = k.value("timed", std::string("call")) == "kernel";
    footnotes.push_back(fmt::format("{}: {:.4g} ms {}{}", name, number_at(*whole, "median_s") * 1e3,
                                    kernel_alone ? "the whole call, with its input preparation"
                                                 : "with the input preparation done outside the library's call",
                                    bound));
  }
  if (const auto alone = k.find("timing_kernel_alone"); alone != k.end() && timed(*alone)) {
    footnotes.push_back(fmt::format("{}: {:.4g} ms the kernel alone, without the input preparation the call does",
                                    name, number_at(*alone, "median_s") * 1e3));
  }
  const std::string status = text_at(k, "status"), reason = text_at(k, "reason");
  if (!reason.empty() && status != "not_verified" && status != "passed") footnotes.push_back(fmt::format("{}: {}", name, reason));
}

// A call whose every timed row reuses another call's timing, and whose every kernel ran cleanly,
// in one line: the timings are that call's (printed there), only the errors are its own.
bool print_as_shared(const nlohmann::json& call, const std::vector<const nlohmann::json*>& rows, std::ostream& out) {
  std::string shared_from;
  double low = std::numeric_limits<double>::infinity(), high = -1;
  std::string worst;
  for (const nlohmann::json* k : rows) {
    const std::string status = text_at(*k, "status");
    if (status != "passed" && status != "not_verified") return false;
    if (k->contains("timing")) {
      const std::string from = text_at(*k, "timing_shared_from");
      if (from.empty() || (!shared_from.empty() && from != shared_from)) return false;
      shared_from = from;
    }
    const auto error = k->find("error");
    if (error == k->end() || error->value("nan_count", 0ll) + error->value("inf_count", 0ll) > 0) return false;
    const double rel_l2 = number_at(*error, "rel_l2");
    low = std::min(low, rel_l2);
    if (rel_l2 > high) high = rel_l2, worst = text_at(*k, "kernel");
  }
  if (shared_from.empty() || worst.empty()) return false;
  // The source is the timed call's, printed with its table, where both come from one file.
  const std::string prefix = text_at(call, "source") + ": ";
  if (shared_from.rfind(prefix, 0) == 0) shared_from = shared_from.substr(prefix.size());
  out << fmt::format("  call {}: timings measured on {} (same shape); {} kernels ran, rel_l2 {} to {} (worst {})\n",
                     call.at("call_index").get<std::int64_t>(), shared_from, rows.size(), g(low), g(high), worst);
  return true;
}

// Each kernel's whole call over the baseline's on this call: `baseline` where it was timed, else the
// fastest exact kernel here (kernel_summary.h says which may be); nothing with fewer than two times.
void print_ratios(const std::vector<const nlohmann::json*>& rows, const std::string& baseline, std::ostream& out) {
  const nlohmann::json* base = nullptr;
  std::size_t timed = 0;
  for (const nlohmann::json* k : rows) {
    const double time = call_time_s(*k);
    if (time <= 0) continue;
    ++timed;
    if (!baseline.empty() ? text_at(*k, "kernel") == baseline
                          : exact_kernel(*k) && (!base || time < call_time_s(*base))) {
      base = k;
    }
  }
  if (!base || timed < 2) return;
  std::vector<std::string> fields;
  for (const nlohmann::json* k : rows) {
    if (k == base || call_time_s(*k) <= 0) continue;
    fields.push_back(fmt::format("{}{} {}x", text_at(*k, "kernel"), k->value("emulation", false) ? " (emul.)" : "",
                                 g(call_time_s(*k) / call_time_s(*base), 3)));
  }
  out << wrap_fields(fields, fmt::format("    whole call over {}'s{}:", text_at(*base, "kernel"),
                                         baseline.empty() ? " (the fastest exact kernel here)" : ""),
                     "        ", "  ");
}

class ResultsTablePrinter final : public Printer {
 public:
  void print(const nlohmann::json& record, std::ostream& out) const override {
    const nlohmann::json options = record.value("options", nlohmann::json::object());
    const auto baseline = options.find("baseline");
    const std::string base = baseline != options.end() && baseline->is_string() ? baseline->get<std::string>() : "";
    for (const auto& call : record.at("calls")) print_call_table(call, out, true, base);
    for (const auto& error : record.at("input_errors")) out << "error: " << error.get<std::string>() << '\n';
  }
};

}  // namespace

void print_call_table(const nlohmann::json& call, std::ostream& out, bool every_kernel, const std::string& baseline) {
  // Fastest first, untimed rows after, the reference last; the refusals are said once, in the
  // run's summary, unless every kernel is asked for (-v), when the rows keep the run's order.
  std::vector<const nlohmann::json*> rows;
  for (const auto& kernel : call.at("kernels")) {
    if (every_kernel || text_at(kernel, "status") != "not_supported") rows.push_back(&kernel);
  }
  if (!every_kernel) {
    const auto rank = [](const nlohmann::json* k) {
      const bool reference = text_at(*k, "kernel").rfind("reference", 0) == 0;
      const auto timing = k->value("timing", nlohmann::json());
      const double median = timed(timing) ? number_at(timing, "median_s") : std::numeric_limits<double>::infinity();
      return std::pair{reference, median};
    };
    std::stable_sort(rows.begin(), rows.end(), [&](auto* a, auto* b) { return rank(a) < rank(b); });
    if (print_as_shared(call, rows, out)) return;
  }
  print_call_header(call, out);
  out << fmt::format(kRowFormat, "kernel", "status", "timed", "median ms", "±%", "TFLOP/s", "GB/s", "%peak", "MHz",
                     "max_abs", "rel_l2", "cosine");
  std::vector<std::string> footnotes;
  for (const nlohmann::json* kernel : rows) {
    print_kernel_row(*kernel, out);
    add_footnotes(*kernel, footnotes);
  }
  print_ratios(rows, baseline, out);
  for (const auto& note : call.at("notes")) footnotes.push_back("note: " + note.get<std::string>());
  for (const std::string& footnote : footnotes) out << "    " << footnote << '\n';
  out << '\n';
}

const Printer& results_table_printer() {
  static const ResultsTablePrinter printer;
  return printer;
}

}  // namespace attnreplay
