#pragma once
// What `attnreplay audit` concludes from a capture's results (replay/run/audit.h measures them): the
// distribution of each error statistic over the calls, the worst calls with their per-head errors,
// a verdict per kernel, and the calls grouped by shape beside random calls of that shape. Pure
// functions over the record, unit-tested on made-up calls; the printers only read the report.
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "replay/judge/distribution.h"
#include "replay/judge/error_stats.h"
#include "replay/judge/input_diagnostics.h"
#include "replay/judge/refcheck.h"
#include "replay/results.h"

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
  // 2: several random calls per shape; 3: error figures over the rows that see a key
  static constexpr int kJsonSchemaVersion = 3;
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

// The per-kernel summaries and the shape groups of a filled report; `per_head` holds each
// (call, kernel)'s per-head errors. Pure: run_audit calls it, and tests call it on made-up calls.
void summarize_audit(AuditReport& report, const RefcheckThresholds& thresholds,
                     const std::map<std::pair<std::size_t, std::string>, std::vector<HeadError>>& per_head);

}  // namespace attnreplay
