#pragma once
// Every row carries the command that reproduces it: the input (a capture and its call, or a
// generated call's flags), the row's kernel, and the flags of the run that change results.
#include <string>

namespace attnreplay {

struct AttentionCall;
struct ReplayOptions;

// `text` as one word for a POSIX shell (rerun commands hold paths).
std::string shell_quote(const std::string& text);

// "attnreplay run caps/run.h5 --calls 3 --kernels flash-cpu --min-samples 20".
std::string rerun_command(const ReplayOptions& options, const std::string& rerun_input, const std::string& kernel,
                          const AttentionCall& call);

}  // namespace attnreplay
