#pragma once
// The results record. Measurement fills it; the table, CSV and JSON printers only read it.
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "formats/attention_call.h"
#include "kernels/kernel.h"
#include "kernels/quant_options.h"
#include "replay/judge/attention_work.h"
#include "replay/judge/error_stats.h"
#include "replay/measure/timing_summary.h"

namespace attnreplay {

// How a (call, kernel) pair ended, after cutlass's profiler dispositions.
enum class Disposition {
  passed,         // ran, and --refcheck thresholds hold
  incorrect,      // ran, and a --refcheck threshold is exceeded
  not_verified,   // ran; no --refcheck thresholds were asked for
  not_supported,  // the kernel declined the call; `reason` says why
  failed,         // the kernel threw; `reason` holds its message
};
std::string_view disposition_name(Disposition disposition);

struct KernelResult {
  std::string kernel;
  std::string source = "built-in";  // or the plug-in file that registered the kernel
  // From the kernel's description: what the report marks (an emulation's time is not
  // representative) and leaves out of the default baseline (a reduced-precision kernel).
  bool emulation = false;
  std::string reduced_precision;  // "int8", "float8_e4m3fn"; empty for an exact kernel
  Disposition disposition = Disposition::not_verified;
  std::string reason;
  // More than the reason's one line, for the JSON only: a plug-in's Python traceback.
  std::string detail;
  // The headline time; absent for the model's own captured output. `timed` says what it covers:
  // "call", the call as users make it (the input preparation included, where there is one), or
  // "kernel", the kernel alone (KernelDescription::headline).
  std::optional<TimingSummary> timing;
  std::string timed = "call";
  // Where `timing` is the kernel alone: the kernel with its input preparation (GQA expansion, mask
  // conversion, quantization), what a user pays, beside the kernel-only figure peers quote.
  std::optional<TimingSummary> timing_with_preparation;
  // Where `timing` is the whole call and there is a preparation: the kernel alone, a breakdown.
  std::optional<TimingSummary> timing_kernel_alone;
  // The preparation alone, timed in turns with the two above.
  std::optional<TimingSummary> timing_of_preparation;
  std::optional<ErrorStats> error;
  std::vector<std::string> refcheck_failures;  // which thresholds were exceeded
  std::string rerun;                           // the command that reruns this row
  // Seconds the kernel spent compiling for this call before any run (a torch.compile'd plug-in's
  // first use), apart from every figure; unset when it compiled nothing here.
  std::optional<double> compile_s;
  // Where the timing was measured when this call reused its group's (replay/run/timing_groups.h).
  std::string timing_shared_from;
  // Achieved rates over the ceilings measured on the same GPU at start-up, when measured.
  std::optional<double> matrix_ceiling_fraction, copy_ceiling_fraction;
  // What the input preparation must move at least (PreparedKernel::preparation_bytes), and the
  // time that takes at the copy ceiling measured at start-up (0 when not measured).
  struct PreparationBound {
    double bytes = 0;
    double bound_s = 0;
  };
  std::optional<PreparationBound> preparation;
  // The preparation's own time, timing_of_preparation's median, and that over its bound; set when
  // it was timed (and for the ratio, when the bound is known).
  std::optional<double> preparation_s() const;
  std::optional<double> preparation_ratio() const;
  // NaN where the timer kept no sample (TimingSummary::untimed), so that no rate is made up.
  double tflops() const { return !timing ? 0.0 : timing->untimed() ? kUntimed : work.tflops(timing->median_s); }
  double gbytes_per_s() const { return !timing ? 0.0 : timing->untimed() ? kUntimed : work.gbytes_per_s(timing->median_s); }
  static constexpr double kUntimed = std::numeric_limits<double>::quiet_NaN();
  AttentionWork work;
};

struct CallResult {
  std::string source;  // file, folder or "generated"
  std::int64_t call_index = 0;
  std::string op, backend;
  AttentionShape shape;
  std::string dtype;
  Layout layout = Layout::bhsd;
  bool is_causal = false;
  CausalAlignment causal_alignment = CausalAlignment::top_left;
  std::string mask;  // "none", or "bool 1x1x16x16" / "float32 ..."
  // What the mask was found to be (formats/mask_structure.h): "causal + left padding, keys from
  // 0/37", or "dense: " and why it is no structure; empty without a mask.
  std::string mask_structure;
  std::vector<std::string> extensions;  // "a sliding window (left 64)", "a softcap of 30", ...
  std::string batching;  // a ragged or paged batch, in words (AttentionCall::describe_batch); or empty
  // A ragged call's (queries, keys) per sequence.
  std::vector<std::pair<std::int64_t, std::int64_t>> sequence_lengths;
  double scale = 0;
  std::map<std::string, std::string> metadata;
  std::vector<std::string> notes;  // e.g. dropout replayed as 0
  QuantOptions quant_options;      // what the quantized kernels used for this call
  std::string case_tag;
  AttentionWork work;
  std::string reference_device = "cpu";
  std::int64_t reference_rows = 0;  // query rows the reference computed per head
  bool reference_sampled = false;
  std::vector<KernelResult> kernels;
  // Where this call's replay spent its wall time, in seconds: "read" (waiting for the call to be
  // read), "reference", "prepare" (kernels' uploads and set-up), "measure" (timing), "judge" (runs
  // that give the judged output, and the comparisons), "compare" (the comparisons alone, part of
  // "judge"): what to look at when a replay is slow.
  std::map<std::string, double> replay_seconds;
  // When its replay began (the wait for its read included) and ended, in seconds since the process
  // started (replay/measure/process_clock.h); 0 where not timed.
  double replay_began_s = 0, replay_ended_s = 0;
};

// Rates measured on the GPU at start-up (replay/measure/ceilings.h), the yardsticks for a kernel's rate.
struct Ceilings {
  double bf16_tflops = 0;  // dense bf16 matrix product
  double fp8_tflops = 0;   // dense fp8 (e4m3) matrix product
  double int8_tops = 0;    // dense int8 matrix product
  double copy_gbps = 0;    // device-to-device copy, bytes read plus bytes written
  // The matrix rate that bounds a kernel taking `dtype` inputs; 0 when none was measured.
  double matrix_tflops_for(DType dtype) const;
};

struct Environment {
  std::map<std::string, std::string> values;  // "cpu", "cores", "torch", "hdf5", "compiler", ...
};

// One process of a run shared among processes (replay/run/sharding.h says how it is found).
struct Shard {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;    // which of the node's GPUs this process takes
  std::string launcher;  // "torchrun", "srun", "Slurm job array", "Open MPI", "PMI", "--shard"; empty alone
  // What every process of one launch shares (a job or run id), so that parts of an earlier launch
  // are never merged into this one; empty when the launcher gives none.
  std::string launch_id;
  bool sharded() const { return world_size > 1; }
  std::string describe() const;  // "rank 1 of 4 (torchrun, local rank 1)"
};

// What a sharded process writes beside its calls, so that `attnreplay merge` can join the parts
// (replay/run/merge.h).
struct ShardPart {
  Shard shard;
  std::string host;
  std::int64_t run_calls = 0;       // calls of the whole run, which every process counts alike
  std::vector<std::int64_t> order;  // for each call of the part: its place among the run's calls
};

struct Report {
  // 2: the command line's "options"; each timing's median interval (median_ci_low_s, _high_s).
  // 3: error figures over the rows that see a key, the whole call's beside (including_rows_without_a_key)
  static constexpr int kJsonSchemaVersion = 3;
  std::string tool_version;
  std::vector<std::string> argv;
  std::string started_utc;
  Environment environment;
  std::string stopping_rule;
  std::vector<CallResult> calls;
  // Inputs, calls or test-list lines that could not be replayed, each naming the place.
  std::vector<std::string> input_errors;
  std::optional<ShardPart> shard_part;  // set in a sharded process's part
  // Seconds since the process started when the record was made: with the calls' replay_began_s and
  // replay_ended_s, where the run's wall time went outside its calls.
  double recorded_s = 0;
  // What kernels compiled ahead of their calls, beside the others' timings (Kernel::expect_calls).
  std::vector<AheadCompilation> compilations_ahead;

  bool any_failed() const;
};

}  // namespace attnreplay
