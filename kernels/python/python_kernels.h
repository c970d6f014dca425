#pragma once
// Kernels written in Python (docs/plugins.md): an interpreter embedded in the attnreplay process
// runs them on the same libtorch, CUDA context and stream as the built-in kernels, and each one
// registered through attnreplay_plugin.py becomes a Kernel like any other.
#include <string>
#include <utility>
#include <vector>

namespace attnreplay {

struct PythonKernelsLoaded {
  // Plug-ins that did not load, each naming its file or module: "x.py: does not import: ...".
  std::vector<std::string> errors;
};

// Starts the interpreter on first use (the Python attnreplay was built with, or $ATTNREPLAY_PYTHON),
// imports the adapters of installed libraries when `with_adapters`, then each of `modules` (files
// or importable module names), and registers every kernel they define.
PythonKernelsLoaded load_python_kernels(const std::vector<std::string>& modules, bool with_adapters);

// What Python would do when its process ends, for an interpreter this process started: its exit
// handlers run (atexit) and its streams are flushed. It is never finalized (the registry holds its
// objects), so nothing else would. Nothing where Python did not start.
void run_python_exit_handlers();

// Kernels an adapter could not offer, with why (its package does not import, or Python did not
// start): (name, reason), for `attnreplay kernels`.
std::vector<std::pair<std::string, std::string>> unavailable_python_kernels();

}  // namespace attnreplay
