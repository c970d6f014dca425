#pragma once
// Replays one call: the reference once, then each selected kernel prepared, checked, timed (or given
// its group's timing) and judged against it. Writes only into the call's result.
#include <optional>
#include <string>

#include "formats/attention_call.h"
#include "kernels/reference.h"
#include "replay/results.h"
#include "replay/run/replay_options.h"

namespace attnreplay {

// Replays `call`; `rerun_input` is what goes before the flags of each row's rerun command.
CallResult replay_call(const AttentionCall& call, const ReplayOptions& options, const std::string& rerun_input);

// The reference a replay compares with: on the device `options` names, on the rows it samples.
// Throws InputError when --reference cuda finds no GPU.
ReferenceOutput reference_for(const AttentionCall& call, const ReplayOptions& options);

// Where the timer discarded every sample of a kernel's timing (a throttled GPU): the call's note
// naming the kernel, the timings and why, which the table, the JSON and stderr (once) carry.
std::optional<std::string> untimed_note(const KernelResult& kernel);

}  // namespace attnreplay
