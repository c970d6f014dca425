#pragma once
// What a replay is asked to do: the kernels, the stopping rules, the reference, the thresholds, the
// kernels' own options, and the hooks for those who watch or want more than the record.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kernels/kernel.h"
#include "kernels/reference.h"
#include "replay/judge/refcheck.h"
#include "replay/measure/stopping_rule.h"
#include "replay/measure/timers.h"
#include "replay/report/progress.h"
#include "replay/results.h"
#include "replay/run/timing_groups.h"

namespace attnreplay {

// What a kernel gave for a call, beside the reference it was compared with: for callers that want
// more than the error statistics (audit's per-head errors). Called once per kernel that ran.
using KernelOutputObserver = std::function<void(const AttentionCall& call, const ReferenceOutput& reference,
                                                const KernelResult& result, const HostTensor& output)>;

// 4 GiB, or a quarter of this machine's memory where that is less.
std::uint64_t default_prefetch_bytes();

struct ReplayOptions {
  std::vector<std::string> kernels{"all"};  // names, or "all"
  StoppingRule stopping = StoppingRule::cpu_default();      // CPU kernels
  StoppingRule stopping_gpu = StoppingRule::gpu_default();  // GPU kernels
  std::int64_t ref_sample_rows = 0;  // 0: every query row
  std::uint64_t seed = 0;            // for row sampling
  std::optional<RefcheckThresholds> refcheck;
  std::string save_outputs_dir;  // one .pt per (call, kernel) when set
  std::string reference_device = "auto";  // "cpu", "cuda", or "auto" (the GPU when there is one)
  bool hot_l2 = false;                    // GPU samples without flushing the L2 first
  // Kernels with an input preparation are timed alone and with it; this adds the preparation by
  // itself (--time-preparation), a third timing, for its ratio to its bound (docs/quantized.md).
  bool time_preparation = false;
  TimingMethod timing = TimingMethod::event;  // how GPU kernels are timed (--timing)
  Ceilings ceilings;  // measured on this GPU at start-up; zeros when not measured
  KernelOptions kernel_options;  // what kernels prepare a call with (the quantized kinds' flags)
  std::string case_tag;
  // The flags, other than inputs, that reproduce this run; each row's rerun command adds to it.
  std::string rerun_base;
  std::string rerun_command = "attnreplay run";  // what each rerun command starts with
  KernelOutputObserver on_kernel_output;          // optional
  // Calls of one group share their timings (replay/run/timing_groups.h); null: every call is timed.
  TimingGroups* timing_groups = nullptr;
  ReplayProgress* progress = nullptr;  // shown on a terminal; null: nothing shown
  // Calls read ahead of the one being replayed hold at most this many bytes, it included
  // (replay/run/prefetch.h).
  std::uint64_t prefetch_bytes = default_prefetch_bytes();
};

}  // namespace attnreplay
