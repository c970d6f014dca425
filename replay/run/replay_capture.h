#pragma once
// Replays the calls of a capture, read ahead within a memory budget (replay/run/prefetch.h).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "formats/byte_pool.h"
#include "formats/capture_source.h"
#include "replay/results.h"
#include "replay/run/replay_options.h"

namespace attnreplay {

// The memory calls are read ahead into: pinned when the reference or a selected kernel runs on a
// GPU (kernels/torch_inputs.h), plain otherwise.
BytePool::Hooks read_ahead_memory(const ReplayOptions& options);

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
