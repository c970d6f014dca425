// A build without Python's embedding library: Python plug-ins cannot load, and say why.
#include <fmt/format.h>

#include "kernels/python/python_kernels.h"

namespace attnreplay {

PythonKernelsLoaded load_python_kernels(const std::vector<std::string>& modules, bool /*with_adapters*/) {
  PythonKernelsLoaded loaded;
  for (const std::string& module : modules) loaded.errors.push_back(fmt::format("{}: not loaded: {}", module, ATTNREPLAY_PYTHON_MISSING));
  return loaded;
}

void run_python_exit_handlers() {}

std::vector<std::pair<std::string, std::string>> unavailable_python_kernels() {
  return {{"(library adapters)", ATTNREPLAY_PYTHON_MISSING}};
}

}  // namespace attnreplay
