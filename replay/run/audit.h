#pragma once
// `attnreplay audit`: how much accuracy each kernel loses over a whole capture, and what it gains in
// speed. The replay measures every call; replay/judge/audit_summary.h summarises the results; this
// adds what only an audit asks for: per-head errors, the same kernels on random inputs of each
// captured shape, and, for the emulated quantized kernels, which quantization step causes the error
// on the worst calls.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "replay/judge/audit_summary.h"
#include "replay/run/replay_options.h"

namespace attnreplay {

// The audit's default stopping rule: a few samples, enough for the speed/accuracy chart, since an
// audit replays every call of a capture (`--full-timing` takes run's rule instead).
StoppingRule audit_stopping_rule(bool gpu);

struct AuditOptions {
  ReplayOptions replay;  // kernels, stopping rule, thresholds (always judged), quantized kernels' options
  std::function<bool(std::int64_t)> wanted_calls;  // empty: every call
  int worst_count = 5;
  bool random_compare = false;
  // Random calls per shape (seeds --seed, --seed + 1, ...): their spread tells a real-tensor
  // effect from the luck of one draw.
  int random_seeds = 3;
  bool attribute = false;
  std::optional<DType> cast_inputs;    // captured floating Q, K, V rounded to this dtype first
  // Flags only `audit` takes (" --full-timing"), for the rerun commands of captured calls; the
  // random calls' reruns are `attnreplay run` commands.
  std::string audit_only_flags;
  std::function<void(const std::string&)> progress;  // optional: one line per call
};

// Replays the calls of every input through the kernels and fills `report` (its `replay` header
// fields are the caller's). Input problems are recorded in report.replay.input_errors.
void run_audit(const std::vector<std::string>& inputs, const AuditOptions& options, AuditReport& report);

}  // namespace attnreplay
