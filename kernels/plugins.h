#pragma once
// The plug-ins a command loads: Python kernel modules (--kernel-module, $ATTNREPLAY_KERNEL_MODULES)
// and C++ kernel libraries (--kernel-library, $ATTNREPLAY_KERNEL_LIBRARIES), plus the adapters of
// the attention libraries installed here. One place decides what loads and when.
#include <string>
#include <utility>
#include <vector>

namespace attnreplay {

class Kernel;

struct PluginFiles {
  std::vector<std::string> modules;    // Python files or importable module names
  std::vector<std::string> libraries;  // shared libraries of C++ kernels
};

// `given` plus the environment's lists (':'-separated), each once.
PluginFiles with_environment_plugins(PluginFiles given);

// True when `kernel_names` (as --kernels takes them) may name a kernel that only Python defines:
// a group ("all", "cpu", "gpu"), or a name no built-in kernel has. Starting Python costs a second or two, so a run of
// built-in kernels alone does without it.
bool selection_needs_python(const std::vector<std::string>& kernel_names);

// Loads the files, and the library adapters when `with_adapters`; returns what failed, each naming
// its file. The kernels that did load are registered.
std::vector<std::string> load_plugins(const PluginFiles& files, bool with_adapters);

// Kernels the library adapters cannot offer here, with why (their package does not import):
// (name, reason).
std::vector<std::pair<std::string, std::string>> unavailable_plugin_kernels();
// One of those as a kernel that declines every call with why, so that a run naming it (a test list
// written for a machine with the library) reports it beside the others rather than failing; null
// for a name no adapter has.
const Kernel* unavailable_plugin_kernel(const std::string& name);

// True once this process has loaded any plug-in code (a C++ library, or Python for modules or
// adapters): code whose destructors or exit handlers may still have something to write.
bool plugin_code_loaded();

// At a command's end: Python plug-ins' exit handlers (atexit) run and Python's streams are flushed,
// which the never-finalized interpreter would not do (python_kernels.h).
void end_plugin_code();

}  // namespace attnreplay
