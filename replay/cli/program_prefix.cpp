#include "replay/cli/program_prefix.h"

namespace attnreplay {

std::filesystem::path program_prefix() {
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::filesystem::path() : exe.parent_path().parent_path();
}

}  // namespace attnreplay
