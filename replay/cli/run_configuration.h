#pragma once
// What a `run` (or `audit`) command line means for the replay: the options table's values turned
// into ReplayOptions, a generated call's description, the calls --calls picks. Each throws
// InputError, naming the flag, for a value the parser let through but the replay cannot take.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "formats/flashinfer_trace.h"
#include "replay/cli/options.h"
#include "replay/run/generate.h"
#include "replay/run/replay_options.h"

namespace attnreplay {

// The options of the replay; `plugin_flags` reload the plug-ins in every rerun command.
ReplayOptions replay_options(const Options& options, const std::string& plugin_flags);

// The stopping-rule flags given, on top of `rule`'s own values.
void apply_stopping_flags(const Options& options, StoppingRule& rule);

// Whether the flags ask for a generated call (--shape, --routine, a dim).
bool wants_generated(const Options& options);
// The generated call's description and the flags that regenerate it.
std::pair<GeneratedCallSpec, std::string> generated_spec(const Options& options);
// A FlashInfer definition without workloads (an fi_trace dump) as a generated call: its heads, head
// dims, page size and dtype; batch and lengths from --batch_size, --s_qo, --s_kv (a decode has one
// query per sequence); causal where its name says so or --causal is given.
std::pair<GeneratedCallSpec, std::string> generated_spec(const Options& options, const FlashInferDefinitionShape& definition);

// "0-40,55" -> a predicate on call indices; empty for an empty text.
std::function<bool(std::int64_t)> parse_call_ranges(const std::string& text);
std::function<bool(std::int64_t)> wanted_calls(const Options& options);

}  // namespace attnreplay
