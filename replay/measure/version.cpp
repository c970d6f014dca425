// The tool's version and commit, in a file of its own: a new commit recompiles only this.
#include <fmt/format.h>

#include "replay/measure/environment.h"

namespace attnreplay {

std::string tool_version() { return fmt::format("{} (git {})", ATTNREPLAY_VERSION, ATTNREPLAY_GIT_SHA); }

}  // namespace attnreplay
