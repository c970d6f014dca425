#pragma once
// The end of a run's table: over every call, per kernel, its time against a baseline kernel, its
// error, the calls it ran and refused; each refusal said once, with its reason and count; what the
// statuses mean. Read from the record's JSON, as the other printers.
#include <nlohmann/json_fwd.hpp>

#include <string>

namespace attnreplay {

// `baseline`: the kernel the times are relative to (--baseline); empty for the fastest exact one
// (not quantized, not an emulation, not the reference) among those that ran.
std::string run_summary_text(const nlohmann::json& record, const std::string& baseline);

}  // namespace attnreplay
