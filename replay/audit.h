#pragma once
// `attnreplay audit`: how much accuracy each kernel loses over a whole capture, and what it gains in
// speed. The replay runner measures every call; this module summarises the results (the
// distribution of each error statistic over calls, the worst calls with their per-head errors, a
// verdict per kernel), and adds what only an audit asks for: the same kernels on random inputs of
// each captured shape, and, for the emulated quantized kernels, which quantization step causes the
// error on the worst calls. It fills an AuditReport; the printers (audit_report.cpp) only read it.
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "replay/distribution.h"
#include "replay/input_diagnostics.h"
#include "replay/results.h"
#include "replay/runner.h"

namespace attnreplay {

// ---- Pure statistics (unit-tested) ----

// The error statistics summarised over calls, in the order printed.
const std::vector<std::string>& audited_statistics();  // rel_l2, cosine, max_abs, mean_abs, rmse
double statistic_of(const ErrorStats& error, const std::string& name);

// A kernel's verdict over the calls it was given: `passed` when every call it ran is within the
// thresholds, `failed` when any is not (or the kernel threw on a call), `not_run` when it declined
// every call.
enum class Verdict { passed, failed, not_run };
std::string_view verdict_name(Verdict verdict);
struct KernelVerdict {
  Verdict verdict = Verdict::not_run;
  std::int64_t calls_judged = 0;         // ran and compared
  std::int64_t calls_failing = 0;        // ran, and a threshold is exceeded
  std::int64_t calls_errored = 0;        // the kernel threw
  std::int64_t calls_not_supported = 0;  // declined, with a reason
};
KernelVerdict verdict_of(std::span<const Disposition> dispositions);

// The order of a kernel's calls from worst to best: outputs with NaN or Inf first, then by
// rel_l2, largest first (ties: earlier call first). Returns indices into `errors`; calls without
// error statistics (not run) are left out.
std::vector<std::size_t> worst_first(const std::vector<const ErrorStats*>& errors);

// ---- What the audit measures ----

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

// One emulation stage set and the error it gives (rounded to the input dtype, as the kernel).
struct StageError {
  std::string stages;  // "none", "qk", "qk+p", "qk+p+pv"
  ErrorStats error;
};

struct WorstCall {
  std::size_t call = 0;  // index into the report's calls
  std::vector<HeadError> per_head;
  // With --attribute, for the emulated kernels (and the CUDA kernels of the same kind): the error
  // with the kind's quantization steps turned on one after another. Empty otherwise.
  std::vector<StageError> attribution;
  std::string attribution_note;  // why it failed, when it was attempted and failed
};

struct KernelAudit {
  std::string kernel;
  std::map<std::string, Distribution> errors;  // by statistic name
  Distribution median_time_s;  // of each call's median time, over calls
  Distribution tflops;
  KernelVerdict verdict;
  std::vector<std::string> thresholds;  // the distinct limits applied, e.g. "cosine >= 0.99, rel_l2 <= 0.15"
  std::vector<std::string> not_supported_reasons;  // the distinct reasons it declined calls
  std::vector<WorstCall> worst;
  // With --attribute, why this kernel's worst calls have no staged emulation (not a quantized kind).
  std::string attribution_note;
};

// Calls of one (shape, dtype, causal) and how each kernel did on them, beside (--random-compare)
// the same kernels on calls of standard normal inputs of that shape, one per seed.
struct ShapeGroup {
  AttentionShape shape;
  Layout layout = Layout::bhsd;  // thd: ragged batches, grouped apart and never compared with random calls
  std::string dtype;
  bool is_causal = false;
  CausalAlignment causal_alignment = CausalAlignment::top_left;
  double scale = 0;
  bool any_mask = false;  // some calls carry a mask, which the random call does not
  std::vector<std::size_t> calls;
  struct KernelSummary {
    std::string kernel;
    std::int64_t calls = 0;  // with error statistics
    double median_rel_l2 = 0, median_cosine = 0, median_max_abs = 0;
    std::optional<double> median_time_s, median_tflops;
  };
  std::vector<KernelSummary> kernels;
  std::vector<CallResult> random;  // --random-compare: one call per seed
};

struct AuditReport {
  static constexpr int kJsonSchemaVersion = 2;  // 2: several random calls per shape
  Report replay;  // version, argv, environment, stopping rule, the calls, input errors
  int worst_count = 0;
  bool random_compare = false;
  int random_seeds = 0;
  bool attribute = false;
  std::optional<DType> cast_inputs;
  QuantOptions quant;
  std::vector<std::optional<InputDiagnostics>> diagnostics;  // per call, with --attribute
  std::vector<KernelAudit> kernels;
  std::vector<ShapeGroup> shapes;

  bool any_verdict_failed() const;
};

// Replays the calls of every input through the kernels and fills `report` (its `replay` header
// fields are the caller's). Input problems are recorded in report.replay.input_errors.
void run_audit(const std::vector<std::string>& inputs, const AuditOptions& options, AuditReport& report);

// The per-kernel summaries and the shape groups of a filled report; `per_head` holds each
// (call, kernel)'s per-head errors. Pure: run_audit calls it, and tests call it on made-up calls.
void summarize_audit(AuditReport& report, const RefcheckThresholds& thresholds,
                     const std::map<std::pair<std::size_t, std::string>, std::vector<HeadError>>& per_head);

// ---- Printers: they only read the report ----

void print_audit_table(const AuditReport& report, std::ostream& out);
nlohmann::json audit_to_json(const AuditReport& report);
void write_audit_json(const AuditReport& report, std::ostream& out);
const std::vector<std::string>& audit_csv_columns();
void write_audit_csv(const AuditReport& report, std::ostream& out);

}  // namespace attnreplay
