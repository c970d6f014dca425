#include <cmath>

#include "replay/report.h"

namespace attnreplay {
namespace {

std::string si(double value, std::string_view unit) {
  static constexpr std::pair<double, const char*> kPrefixes[] = {{1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "k"}};
  for (const auto& [scale, prefix] : kPrefixes) {
    if (std::abs(value) >= scale) return fmt::format("{:.3g} {}{}", value / scale, prefix, unit);
  }
  return fmt::format("{:.3g} {}", value, unit);
}

std::string g(double value, int digits = 3) {
  if (std::isnan(value)) return "nan";
  return fmt::format("{:.{}g}", value, digits);
}

}  // namespace

void print_call_table(const CallResult& call, std::ostream& out) {
  out << fmt::format("{}{}: call {}  {}{}  {} {}  {}  mask {}  scale {:.4g}\n",
                     call.case_tag.empty() ? "" : "[" + call.case_tag + "] ", call.source, call.call_index,
                     call.op.empty() ? "" : call.op + " ", call.backend.empty() ? "" : "(" + call.backend + ")",
                     call.dtype, layout_name(call.layout), call.shape.to_string(), call.mask, call.scale);
  out << fmt::format("  {}{}{}{}work {}, {}, {:.3g} FLOP/B{}\n", call.is_causal ? "causal " : "",
                     call.is_causal ? std::string(causal_alignment_name(call.causal_alignment)) + "  " : std::string(),
                     call.batching.empty() ? "" : call.batching + "  ",
                     call.extensions.empty() ? "" : fmt::format("{}  ", fmt::join(call.extensions, ", ")),
                     si(call.work.flops, "FLOP"), si(call.work.bytes, "B"), call.work.arithmetic_intensity(),
                     call.reference_sampled ? fmt::format("  (errors on {} sampled query rows)", call.reference_rows) : "");
  out << fmt::format("  {:<18} {:<13} {:>10} {:>6} {:>9} {:>9} {:>6} {:>6} {:>10} {:>10} {:>12}\n", "kernel",
                     "status", "median ms", "±%", "TFLOP/s", "GB/s", "%peak", "MHz", "max_abs", "rel_l2", "cosine");
  std::vector<std::string> footnotes;
  for (const KernelResult& k : call.kernels) {
    std::string time = "-", spread = "-", tflops = "-", gbps = "-", clock = "-";
    if (k.timing && !k.timing->untimed()) {  // else the call's notes say why
      time = fmt::format("{:.4g}", k.timing->median_s * 1e3);
      // The SM clock during the samples: at a power limit it sits well under the rated one.
      if (k.timing->sm_clock_median_mhz > 0) clock = fmt::format("{:.0f}", k.timing->sm_clock_median_mhz);
      spread = fmt::format("{:.2g}", k.timing->spread_rel * 100);
      tflops = g(k.tflops(), 4);
      gbps = g(k.gbytes_per_s(), 4);
    }
    std::string max_abs = "-", rel_l2 = "-", cosine = "-";
    if (k.error) {
      max_abs = g(k.error->max_abs);
      rel_l2 = g(k.error->rel_l2);
      cosine = fmt::format("{:.8f}", k.error->cosine);
      if (k.error->nan_count || k.error->inf_count) {
        footnotes.push_back(fmt::format("{}: {} NaN, {} Inf in the output", k.kernel, k.error->nan_count, k.error->inf_count));
      }
      if (const auto& subset = k.error->rows_with_a_key) {
        footnotes.push_back(fmt::format("{}: over the rows that see a key (not the {} that see none): max_abs {}, "
                                        "rel_l2 {}, cosine {:.8f}{}", k.kernel, k.error->no_key_rows,
                                        g(subset->max_abs), g(subset->rel_l2), subset->cosine,
                                        subset->nan_count + subset->inf_count > 0
                                            ? fmt::format(", {} NaN, {} Inf", subset->nan_count, subset->inf_count)
                                            : std::string()));
      }
    }
    // The larger of the two fractions of this GPU's measured ceilings: what bounds the kernel.
    std::string peak = "-";
    if (k.matrix_ceiling_fraction || k.copy_ceiling_fraction) {
      peak = fmt::format("{:.0f}", 100 * std::max(k.matrix_ceiling_fraction.value_or(0), k.copy_ceiling_fraction.value_or(0)));
    }
    out << fmt::format("  {:<18} {:<13} {:>10} {:>6} {:>9} {:>9} {:>6} {:>6} {:>10} {:>10} {:>12}\n", k.kernel,
                       disposition_name(k.disposition), time, spread, tflops, gbps, peak, clock, max_abs, rel_l2,
                       cosine);
    // The default methods go without saying; the others are named beside their figures.
    if (k.timing && k.timing->method != "cpu-steady-clock" &&
        (k.timing->method != "cuda-event" || k.timing->cache != "cold-l2")) {
      footnotes.push_back(fmt::format("{}: timed by {}, {}{}", k.kernel, k.timing->method, k.timing->cache,
                                      k.timing->runs_per_sample > 1
                                          ? fmt::format(", {} runs per sample", k.timing->runs_per_sample)
                                          : std::string()));
    }
    if (k.timing_with_preparation && !k.timing_with_preparation->untimed()) {
      // The preparation's own time beside moving its bytes at the copy ceiling, where measured.
      std::string bound;
      if (const auto ratio = k.preparation_ratio()) {
        bound = fmt::format(" (preparation alone {:.4g} ms, {:.2f}x its bound: {} at the copy ceiling, {:.4g} ms)",
                            *k.preparation_s() * 1e3, *ratio, si(k.preparation->bytes, "B"), k.preparation->bound_s * 1e3);
      }
      footnotes.push_back(fmt::format("{}: {:.4g} ms with its input preparation{}", k.kernel,
                                      k.timing_with_preparation->median_s * 1e3, bound));
    }
    if (!k.reason.empty() && k.disposition != Disposition::not_verified && k.disposition != Disposition::passed) {
      footnotes.push_back(fmt::format("{}: {}", k.kernel, k.reason));
    }
  }
  for (const std::string& note : call.notes) footnotes.push_back("note: " + note);
  for (const std::string& footnote : footnotes) out << "    " << footnote << '\n';
  out << '\n';
}

void print_table(const Report& report, std::ostream& out) {
  for (const CallResult& call : report.calls) print_call_table(call, out);
  for (const std::string& error : report.input_errors) out << "error: " << error << '\n';
}

}  // namespace attnreplay
