#pragma once
// Where this program's other pieces are: the folder above its own, which is the build tree
// (replay/attnreplay beside capture/, scripts/ in the sources) or the install prefix
// (bin/attnreplay beside lib/ and share/attnreplay/).
#include <filesystem>

namespace attnreplay {

// Empty when /proc/self/exe cannot be read.
std::filesystem::path program_prefix();

}  // namespace attnreplay
