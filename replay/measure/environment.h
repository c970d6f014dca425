#pragma once
#include "replay/results.h"

namespace attnreplay {

// What the numbers were measured on: CPU, cores, OS, compiler, build, library versions.
Environment describe_environment();
std::string tool_version();  // "0.1.0 (git abc1234)"

// A record's header: the tool's version, the command line, when it started, and the environment.
void describe_run(Report& report, const std::vector<std::string>& argv);

}  // namespace attnreplay
