#pragma once
// Over every call of a record (a run's or an audit's), per kernel: its time against a baseline
// kernel's, its error, the calls it ran, refused and failed; each refusal with its reason and
// count. What the run's closing summary prints and the HTML report draws, worked out once.
#include <nlohmann/json_fwd.hpp>

#include <string>
#include <utility>
#include <vector>

namespace attnreplay {

struct KernelStanding {
  std::string name;
  bool emulation = false;  // a CPU emulation of a GPU kernel: its time is not representative
  bool exact = true;       // not quantized, not the reference
  int ran = 0, refused = 0, failed = 0;
  int timed = 0;  // calls with a time
  // The geometric mean, over the calls both timed, of this kernel's time over the baseline's
  // (below 1: faster); NaN when there is none.
  double vs_baseline = 0;
  double median_rel_l2 = 0, worst_rel_l2 = 0;  // NaN when nothing was judged; a NaN error is the worst
  std::string worst_call;                      // "call 3 [flux-4096]"
};

struct Refusal {
  std::string reason;
  std::vector<std::pair<std::string, int>> kernels;  // (kernel, calls it refused for this reason)
};

struct KernelSummary {
  std::size_t calls = 0;
  std::string baseline;       // empty when no kernel was timed
  std::string baseline_note;  // "--baseline", or why the fastest exact kernel was taken
  std::vector<KernelStanding> kernels;  // fastest against the baseline first; kernels that only refused last
  std::vector<Refusal> refusals;        // in the order first met
};

// `baseline`: the kernel the times are relative to (--baseline); empty for the fastest exact one
// (not quantized, not an emulation, not the reference) among those timed. A kernel's time is its
// whole call's (with its input preparation) where that was timed, as users would pay it.
KernelSummary summarize_kernels(const nlohmann::json& record, const std::string& baseline);

// "call 3 [flux-4096]"; a long tag (a test list's path and line) keeps its end.
std::string call_name(const nlohmann::json& call);

// A kernel row's whole-call median: the headline's unless that is the kernel alone (`timed`), when
// the call was timed apart with its input preparation; 0 when untimed.
double call_time_s(const nlohmann::json& kernel);

// Whether a kernel row may be a default baseline: exact (not quantized, not the reference), not an
// emulation.
bool exact_kernel(const nlohmann::json& kernel);

}  // namespace attnreplay
