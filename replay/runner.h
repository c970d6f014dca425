#pragma once
// Replays calls through kernels: reference once per call, then each selected kernel measured and
// compared. Writes only into the results record.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "formats/byte_pool.h"
#include "formats/capture_source.h"
#include "kernels/quantized_attention.h"
#include "kernels/reference.h"
#include "replay/gpu_timing.h"
#include "replay/progress.h"
#include "replay/results.h"
#include "replay/timing_groups.h"

namespace attnreplay {

struct RefcheckThresholds {
  // Unset fields take the default for the call's dtype (docs/cli.md).
  std::optional<double> min_cosine;
  std::optional<double> max_rel_l2;
  std::optional<double> max_abs;
};

// The thresholds --refcheck applies to one kernel on one call: the asked ones, and for the rest
// the defaults of the dtype the kernel computes in (docs/metrics.md).
struct RefcheckLimits {
  double min_cosine = 0;
  double max_rel_l2 = 0;
  std::optional<double> max_abs;
};
RefcheckLimits refcheck_limits(const RefcheckThresholds& asked, DType dtype);

// What a kernel gave for a call, beside the reference it was compared with: for callers that want
// more than the error statistics (audit's per-head errors). Called once per kernel that ran.
using KernelOutputObserver = std::function<void(const AttentionCall& call, const ReferenceOutput& reference,
                                                const KernelResult& result, const HostTensor& output)>;

// 4 GiB, or a quarter of this machine's memory where that is less.
std::uint64_t default_prefetch_bytes();

struct ReplayOptions {
  std::vector<std::string> kernels{"all"};  // names, or "all"
  StoppingRule stopping;      // CPU kernels
  StoppingRule stopping_gpu;  // GPU kernels: nvbench's defaults unless flags say otherwise
  std::int64_t ref_sample_rows = 0;  // 0: every query row
  std::uint64_t seed = 0;            // for row sampling
  std::optional<RefcheckThresholds> refcheck;
  std::string save_outputs_dir;  // one .pt per (call, kernel) when set
  std::string reference_device = "auto";  // "cpu", "cuda", or "auto" (the GPU when there is one)
  bool hot_l2 = false;                    // GPU samples without flushing the L2 first
  TimingMethod timing = TimingMethod::event;  // how GPU kernels are timed (--timing)
  Ceilings ceilings;  // measured on this GPU at start-up; zeros when not measured
  QuantOptions quant;  // what the quantized kernels use (docs/quantized.md)
  std::string case_tag;
  // The flags, other than inputs, that reproduce this run; each row's rerun command adds to it.
  std::string rerun_base;
  std::string rerun_command = "attnreplay run";  // what each rerun command starts with
  KernelOutputObserver on_kernel_output;          // optional
  // Calls of one group share their timings (replay/timing_groups.h); null: every call is timed.
  TimingGroups* timing_groups = nullptr;
  ReplayProgress* progress = nullptr;  // shown on a terminal; null: nothing shown
  // Calls read ahead of the one being replayed hold at most this many bytes, it included
  // (replay/prefetch.h).
  std::uint64_t prefetch_bytes = default_prefetch_bytes();
};

// `text` as one word for a POSIX shell (rerun commands hold paths).
std::string shell_quote(const std::string& text);

// Resolves kernel names ("all" expands), throwing InputError for unknown names.
std::vector<const class Kernel*> select_kernels(const std::vector<std::string>& names);

// The reference a replay compares with: on the device `options` names, on the rows it samples.
// Throws InputError when --reference cuda finds no GPU.
ReferenceOutput reference_for(const AttentionCall& call, const ReplayOptions& options);

// The memory calls are read ahead into: pinned when the reference or a selected kernel runs on a
// GPU (kernels/torch_inputs.h), plain otherwise.
BytePool::Hooks read_ahead_memory(const ReplayOptions& options);

// Replays one call; `rerun_input` is what goes before the flags of the rerun command.
CallResult replay_call(const AttentionCall& call, const ReplayOptions& options, const std::string& rerun_input);

// Where the timer discarded every sample of a kernel's timing (a throttled GPU): the call's note
// naming the kernel, the timings and why, which the table, the JSON and stderr (once) carry.
std::optional<std::string> untimed_note(const KernelResult& kernel);

// The positions of `source` whose call index `wanted` accepts (all when it is empty), reading
// headers only; a header that cannot be read is an error in `errors`.
std::vector<std::size_t> wanted_positions(CaptureSource& source, const std::function<bool(std::int64_t)>& wanted,
                                          std::vector<std::string>& errors);

// Replays the calls of a capture whose call index `wanted` accepts, read ahead within
// `options.prefetch_bytes`, appending results and per-call load errors to `report`; `on_loaded`
// sees each call once loaded, `on_call` each result as it is made.
void replay_capture(CaptureSource& source, const std::function<bool(std::int64_t)>& wanted,
                    const ReplayOptions& options, Report& report,
                    const std::function<void(const CallResult&)>& on_call = {},
                    const std::function<void(const AttentionCall&)>& on_loaded = {});

}  // namespace attnreplay
