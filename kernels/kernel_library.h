#pragma once
// C++/CUDA kernels built outside this repository (docs/plugins.md): a shared library whose kernels
// register themselves with ATTNREPLAY_REGISTER_KERNEL, as the built-in ones do. attnreplay exports
// its symbols, so the library links nothing of attnreplay's and shares its one registry.
#include <string>

namespace attnreplay {

// Loads `path` and registers its kernels, recorded as coming from it. Throws InputError naming the
// file when it does not load or registers nothing usable.
void load_kernel_library(const std::string& path);

}  // namespace attnreplay
