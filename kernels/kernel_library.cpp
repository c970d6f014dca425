#include "kernels/kernel_library.h"

#include <dlfcn.h>

#include <filesystem>

#include "formats/errors.h"
#include "kernels/kernel.h"

namespace attnreplay {

void load_kernel_library(const std::string& path) {
  namespace fs = std::filesystem;
  // A bare name would be searched for on the library path; the user means the file.
  const std::string file = fs::exists(path) ? fs::absolute(path).lexically_normal().string() : path;
  if (!fs::exists(file)) throw InputError(fmt::format("{}: no such kernel library", path));
  KernelRegistry& registry = KernelRegistry::instance();
  const std::size_t before = registry.kernels().size();
  {
    KernelRegistry::SourceScope scope(file);
    // RTLD_LOCAL: two plug-ins' own symbols cannot collide; attnreplay's reach both.
    if (!dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      const char* error = dlerror();
      throw InputError(fmt::format("{}: does not load: {}", path, error ? error : "unknown error"));
    }
  }
  const std::vector<std::string> rejected = registry.take_rejected();
  if (!rejected.empty()) throw InputError(fmt::format("{}", fmt::join(rejected, "; ")));
  if (registry.kernels().size() == before) {
    throw InputError(fmt::format("{}: registered no kernel (ATTNREPLAY_REGISTER_KERNEL in one of its files?)", path));
  }
}

}  // namespace attnreplay
