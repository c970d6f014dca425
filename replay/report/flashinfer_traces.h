#pragma once
// FlashInfer-Bench traces of a run (`run --fib-traces FILE.jsonl`): one Trace per (workload, kernel)
// for the calls read from a FlashInfer-Trace folder, as FlashInfer-Bench's own evaluations write
// them (docs/format.md): the workload as the folder holds it, the kernel as the solution, and an
// evaluation of status, correctness, performance and environment. Read from the record's JSON.
#include <nlohmann/json_fwd.hpp>

#include <string>
#include <vector>

namespace attnreplay {

struct FlashInferTraces {
  std::vector<std::string> lines;  // JSON, one Trace each
  // What has no trace, in words: calls from other captures, kernels that declined a workload.
  std::vector<std::string> notes;
};

// `baseline`: the kernel whose time is each trace's reference_latency_ms (--baseline); empty: none
// (0, as FlashInfer-Bench writes where it has no reference time).
FlashInferTraces flashinfer_traces(const nlohmann::json& record, const std::string& baseline);

}  // namespace attnreplay
