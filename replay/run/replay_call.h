#pragma once
// Replays one call: the reference once, then each selected kernel prepared, checked, timed (or given
// its group's timing) and judged against it. Writes only into the call's result.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "formats/attention_call.h"
#include "kernels/reference.h"
#include "replay/results.h"
#include "replay/run/replay_options.h"

namespace attnreplay {

// Replays `call`; `rerun_input` is what goes before the flags of each row's rerun command.
CallResult replay_call(const AttentionCall& call, const ReplayOptions& options, const std::string& rerun_input);

// A call's replay in parts, for kernels that are not ready() yet (a library still importing or
// compiling on a thread of its own): the reference at once, each kernel once it is ready, and the
// result in the order --kernels gives whatever order they ran in. The call's tensors and its
// reference are held meanwhile.
class CallInReplay {
 public:
  CallInReplay(const AttentionCall& call, const ReplayOptions& options, std::string rerun_input);
  ~CallInReplay();
  CallInReplay(const CallInReplay&) = delete;
  CallInReplay& operator=(const CallInReplay&) = delete;

  // Replays the kernels that are ready now; true when none is left.
  bool replay_ready_kernels();
  // Replays those left, each once it is ready, then the model's output, and returns the result.
  CallResult finish();
  // What it holds while kernels wait: the call's tensors and its reference.
  std::uint64_t bytes_held() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The reference a replay compares with: on the device `options` names, on the rows it samples.
// Throws InputError when --reference cuda finds no GPU.
ReferenceOutput reference_for(const AttentionCall& call, const ReplayOptions& options);

// Where the timer discarded every sample of a kernel's timing (a throttled GPU): the call's note
// naming the kernel, the timings and why, which the table, the JSON and stderr (once) carry.
std::optional<std::string> untimed_note(const KernelResult& kernel);

}  // namespace attnreplay
