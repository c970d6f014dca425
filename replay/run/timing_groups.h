#pragma once
// Time per shape, judge per call. A capture repeats a few shapes many times (a 50-step video model,
// a serving trace); calls whose timing cannot differ share one measurement per kernel, while every
// call is still run and judged against its own reference.
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "formats/attention_call.h"
#include "replay/measure/measure.h"

namespace attnreplay {

// What a kernel's time depends on: the dims, dtypes, layout and the model's strides of Q, K and V;
// the mask's dtype, shape, strides and contents (a block-sparse kernel skips what it hides); and
// causality with its alignment; a window, softcap, ALiBi or sinks; a ragged batch's lengths and
// pages. Q, K and V's values are not part of it; nor the mask's and lengths', for a call loaded
// without data.
std::string timing_key(const AttentionCall& call);

struct SharedTiming {
  std::optional<TimingSummary> timing;
  std::string timed;  // what `timing` covers (KernelResult::timed)
  std::optional<TimingSummary> with_preparation, kernel_alone, of_preparation;
  std::string timed_call;  // where the measurement was taken: "run.h5: call 3"
};

class TimingGroups {
 public:
  // The first `timed_per_group` calls of a group are timed for each kernel; 0 times every call.
  explicit TimingGroups(int timed_per_group) : timed_per_group_(timed_per_group) {}
  // The measurement `kernel` reuses on a call of group `key`, or nullptr when the call is timed.
  const SharedTiming* shared(const std::string& key, const std::string& kernel) const;
  // Records a timed call's measurement of `kernel`.
  void record(const std::string& key, const std::string& kernel, SharedTiming timing);

 private:
  struct Entry {
    int timed = 0;
    SharedTiming first;
  };
  int timed_per_group_;
  std::map<std::pair<std::string, std::string>, Entry> entries_;
};

}  // namespace attnreplay
