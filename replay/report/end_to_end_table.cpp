#include "replay/report/end_to_end_table.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace attnreplay {
namespace {

std::string number(const nlohmann::json& value, const char* format = "{:.3g}") {
  if (value.is_string()) return value.get<std::string>();
  return fmt::format(fmt::runtime(format), value.get<double>());
}

}  // namespace

void print_end_to_end(const nlohmann::json& record, std::ostream& out) {
  const std::string kernel = record["kernel"];
  out << fmt::format("attnreplay e2e: {} substituted into `{}`\n\n", kernel,
                     fmt::join(record["command"].get<std::vector<std::string>>(), " "));
  // A GPU run's first call carries one-time costs (loading kernels, cuDNN's plans), which can
  // outweigh every other call: said beside.
  auto attention_text = [](const nlohmann::json& run) {
    const double first = run["attention"].value("gpu_first_call_s", 0.0);
    const double total = run["attention_s"].get<double>();
    return first > 0 ? fmt::format("{:.4f} s (first call {:.4f} s)", total, first) : fmt::format("{:.4f} s", total);
  };
  std::size_t width = 9;
  for (const auto& run : record["runs"]) width = std::max(width, attention_text(run).size());
  out << fmt::format("{:<12} {:>9} {:>6}  {:>{}}  {}\n", "run", "wall", "calls", "attention", width, "substituted");
  for (const auto& run : record["runs"]) {
    std::string substituted = "-";
    if (run.contains("substitution")) {
      const auto& s = run["substitution"];
      substituted = fmt::format("{}, {} left to the original op", s["substituted"].get<int>(), s["left"].get<int>());
    }
    out << fmt::format("{:<12} {:>7.2f} s {:>6}  {:>{}}  {}\n", run["run"].get<std::string>(), run["wall_s"].get<double>(),
                       run["attention_calls"].get<int>(), attention_text(run), width, substituted);
    if (run.contains("substitution")) {
      for (const auto& [reason, count] : run["substitution"]["left_by_reason"].items()) {
        out << fmt::format("{:<12} {} left: {}\n", "", count.get<int>(), reason);
      }
      if (run["substitution"]["substituted"].get<int>() == 0) {
        out << fmt::format("{:<12} {} substituted no call: the two runs computed attention alike\n", "", kernel);
      }
    }
  }
  out << "(attention: GPU work's time between CUDA events on its stream, a substituted kernel's too where it ran on "
         "the job's tensors;\n other calls' wall time on the job's thread, any round trip through the host included.\n"
         " Both runs are captured for the layer view below, which costs them time: --no-layers gives the job's own "
         "step times.)\n";

  out << "\nwhat the job saved, substituted against as is:\n";
  for (const auto& file : record["outputs"]) {
    for (const auto& tensor : file["tensors"]) {
      const std::string name = tensor["tensor"].get<std::string>().empty()
                                   ? file["output"].get<std::string>()
                                   : fmt::format("{} {}", file["output"].get<std::string>(), tensor["tensor"].get<std::string>());
      if (tensor.contains("missing")) {
        out << fmt::format("  {}: {}\n", name, tensor["missing"].get<std::string>());
        continue;
      }
      const auto& d = tensor["distance"];
      out << fmt::format("  {} [{}] {}: cosine {}  rel_l2 {}  max_abs {}  PSNR {} dB  ({} of {} elements differ)\n",
                         name, fmt::join(tensor["shape"].get<std::vector<std::int64_t>>(), "x"),
                         tensor["dtype"].get<std::string>(), number(d["cosine"], "{:.6f}"), number(d["rel_l2"]),
                         number(d["max_abs"]), number(d["psnr_db"], "{:.1f}"), d["differing"].get<std::int64_t>(),
                         d["elements"].get<std::int64_t>());
      // Token ids: where the sequences part.
      const std::string dtype = tensor["dtype"];
      const bool integers = dtype.find("int") != std::string::npos || dtype == "bool";
      if (d.contains("first_difference") && integers) {
        out << fmt::format("    first difference at [{}]\n",
                           fmt::join(d["first_difference"].get<std::vector<std::int64_t>>(), ", "));
      }
      if (d.contains("ssim")) out << fmt::format("    image: SSIM {:.4f}\n", d["ssim"].get<double>());
      if (tensor.contains("logits")) {
        const auto& l = tensor["logits"];
        out << fmt::format("    logits: top-1 agreement {:.4f} over {} rows, mean KL {:.3g} nats\n",
                           l["top1_agreement"].get<double>(), l["rows"].get<std::int64_t>(), l["mean_kl"].get<double>());
      }
    }
  }

  // Each call's own error against exact attention of its own inputs; its queries' and output's distance
  // from the run as is (rel_l2, over the rows that see a key).
  auto table = [&out](const nlohmann::json& groups, const char* key) {
    out << fmt::format("  {:>5} {:>6} {:>12} {:>11} {:>15} {:>16}\n", key, "calls", "substituted", "own error",
                       "input distance", "output distance");
    for (const auto& group : groups) {
      out << fmt::format("  {:>5} {:>6} {:>12} {:>11.3g} {:>15.3g} {:>16.3g}\n", group[key].get<std::int64_t>(),
                         group["calls"].get<int>(), group["substituted"].get<int>(), group["own_rel_l2"].get<double>(),
                         group["input_rel_l2"].get<double>(), group["output_rel_l2"].get<double>());
    }
  };
  if (record.contains("layers")) {
    out << fmt::format("\nthrough the layers (step {}): each call's own error against exact attention of its own inputs,\n"
                       "its queries' and its output's distance from the run as is (rel_l2, rows that see a key; the worst "
                       "per layer):\n", record["layers_step"].get<std::int64_t>());
    table(record["layers"], "layer");
  }
  if (record.contains("steps") && record["steps"].size() > 1) {
    out << "\nstep by step (the worst over layers; once an LLM's tokens part, its later steps see other tokens):\n";
    table(record["steps"], "step");
  }
  if (record.contains("notes")) {
    for (const auto& note : record["notes"]) out << "note: " << note.get<std::string>() << '\n';
  }
}

}  // namespace attnreplay
