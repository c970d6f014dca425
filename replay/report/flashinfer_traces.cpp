#include "replay/report/flashinfer_traces.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <map>

#include "formats/flashinfer_trace.h"
#include "replay/judge/kernel_summary.h"
#include "replay/report/json_values.h"

namespace attnreplay {
namespace {
using nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// FlashInfer-Bench's JSON for a float that may not be finite (pydantic's ser_json_inf_nan="strings").
ordered_json float_json(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  return value;
}

// "NVIDIA_H100_80GB_HBM3", as FlashInfer-Bench names hardware; the CPU's model where no GPU ran.
std::string hardware(const json& environment) {
  std::string name = text_at(environment, "gpu");
  if (name.empty() || name == "none") name = text_at(environment, "cpu");
  if (name.empty()) name = "unknown";
  for (char& c : name) {
    if (c == ' ') c = '_';
  }
  return name;
}

ordered_json libraries(const json& environment, const std::string& tool_version) {
  ordered_json libs = {{"attnreplay", tool_version}};
  for (const char* key : {"torch", "cuda_driver", "torch_cuda_runtime", "cudnn"}) {
    if (const std::string value = text_at(environment, key); !value.empty()) libs[key] = value;
  }
  return libs;
}

}  // namespace

FlashInferTraces flashinfer_traces(const json& record, const std::string& baseline) {
  FlashInferTraces traces;
  const json environment = record.value("environment", json::object());
  const ordered_json env = {{"hardware", hardware(environment)},
                            {"libs", libraries(environment, text_at(record, "tool_version"))}};
  const std::string timestamp = text_at(record, "started_utc");
  int other_calls = 0;
  std::map<std::string, int> declined;  // kernel -> workloads
  for (const json& call : record.value("calls", json::array())) {
    const json metadata = call.value("metadata", json::object());
    const std::string definition = text_at(metadata, kFlashInferDefinitionKey);
    const std::string workload_text = text_at(metadata, kFlashInferWorkloadKey);
    if (definition.empty() || workload_text.empty()) {
      ++other_calls;
      continue;
    }
    const ordered_json workload = ordered_json::parse(workload_text);
    double reference_s = 0;
    for (const json& kernel : call.value("kernels", json::array())) {
      if (!baseline.empty() && text_at(kernel, "kernel") == baseline) reference_s = call_time_s(kernel);
    }
    for (const json& kernel : call.value("kernels", json::array())) {
      const std::string name = text_at(kernel, "kernel");
      if (name == "model-output") continue;  // the model's own output: no kernel ran
      const std::string disposition = text_at(kernel, "status");
      if (disposition == "not_supported") {
        ++declined[name];
        continue;
      }
      ordered_json evaluation = {{"status", ""}, {"environment", env}, {"timestamp", timestamp}, {"log", text_at(kernel, "reason")}};
      if (disposition == "failed" || !kernel.contains("error")) {
        evaluation["status"] = "RUNTIME_ERROR";
      } else {
        const json& error = kernel.at("error");
        const bool finite = error.value("nan_count", 0) == 0 && error.value("inf_count", 0) == 0;
        ordered_json correctness = {
            {"max_relative_error", finite ? float_json(number_at(error, "max_rel")) : float_json(INFINITY)},
            {"max_absolute_error", finite ? float_json(number_at(error, "max_abs")) : float_json(INFINITY)},
            {"extra",
             {{"reference", "attnreplay's fp64 reference"},
              {"rel_l2", float_json(number_at(error, "rel_l2"))},
              {"cosine", float_json(number_at(error, "cosine"))},
              {"nan_count", error.value("nan_count", 0)},
              {"inf_count", error.value("inf_count", 0)},
              {"beyond_tolerance", error.value("beyond_tolerance", 0)},
              {"attnreplay_disposition", disposition}}}};
        // --refcheck's verdict where thresholds were given; else FlashInfer-Bench's own tolerance.
        const bool passed = finite && (disposition == "passed" ||
                                       (disposition == "not_verified" && error.value("beyond_tolerance", 0) == 0));
        evaluation["status"] = passed ? "PASSED" : "INCORRECT_NUMERICAL";
        evaluation["correctness"] = correctness;
        if (passed) {
          const double latency_s = call_time_s(kernel);
          evaluation["performance"] = {{"latency_ms", latency_s * 1e3},
                                       {"reference_latency_ms", reference_s * 1e3},
                                       {"speedup_factor", latency_s > 0 && reference_s > 0 ? reference_s / latency_s : 0.0}};
        }
      }
      const ordered_json trace = {{"definition", definition}, {"workload", workload}, {"solution", name}, {"evaluation", evaluation}};
      traces.lines.push_back(trace.dump());
    }
  }
  if (other_calls) {
    traces.notes.push_back(fmt::format("{} call{} not read from a FlashInfer-Trace folder: no trace (attnreplay convert CAPTURE "
                                       "DIR --to flashinfer-trace makes workloads of them)",
                                       other_calls, other_calls == 1 ? "" : "s"));
  }
  for (const auto& [kernel, count] : declined) {
    traces.notes.push_back(fmt::format("{} declined {} workload{}: no trace (FlashInfer-Bench has no status for a kernel that "
                                       "does not take a call)",
                                       kernel, count, count == 1 ? "" : "s"));
  }
  return traces;
}

}  // namespace attnreplay
