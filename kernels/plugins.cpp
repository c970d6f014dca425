#include "kernels/plugins.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <sstream>

#include "formats/errors.h"
#include "kernels/kernel.h"
#include "kernels/kernel_library.h"
#include "kernels/python/python_kernels.h"

namespace attnreplay {
namespace {

std::atomic<bool> loaded_plugin_code{false};

void append_unique(std::vector<std::string>& to, const std::string& item) {
  if (!item.empty() && std::find(to.begin(), to.end(), item) == to.end()) to.push_back(item);
}

void append_environment_list(std::vector<std::string>& to, const char* variable) {
  const char* value = std::getenv(variable);
  if (!value) return;
  std::stringstream stream(value);
  for (std::string item; std::getline(stream, item, ':');) append_unique(to, item);
}

}  // namespace

PluginFiles with_environment_plugins(PluginFiles given) {
  PluginFiles files;
  for (const auto& module : given.modules) append_unique(files.modules, module);
  for (const auto& library : given.libraries) append_unique(files.libraries, library);
  append_environment_list(files.modules, "ATTNREPLAY_KERNEL_MODULES");
  append_environment_list(files.libraries, "ATTNREPLAY_KERNEL_LIBRARIES");
  return files;
}

bool selection_needs_python(const std::vector<std::string>& kernel_names) {
  return std::any_of(kernel_names.begin(), kernel_names.end(), [](const std::string& name) {
    return name == "all" || name == "cpu" || name == "gpu" || !KernelRegistry::instance().find(name);
  });
}

std::vector<std::string> load_plugins(const PluginFiles& files, bool with_adapters) {
  std::vector<std::string> errors;
  if (!files.libraries.empty() || !files.modules.empty() || with_adapters) loaded_plugin_code = true;
  for (const std::string& library : files.libraries) {
    try {
      load_kernel_library(library);
    } catch (const InputError& error) {
      errors.push_back(error.what());
    }
  }
  if (!files.modules.empty() || with_adapters) {
    PythonKernelsLoaded loaded = load_python_kernels(files.modules, with_adapters);
    errors.insert(errors.end(), loaded.errors.begin(), loaded.errors.end());
  }
  return errors;
}

std::vector<std::pair<std::string, std::string>> unavailable_plugin_kernels() {
  loaded_plugin_code = true;  // Python starts to tell
  return unavailable_python_kernels();
}

namespace {

class UnavailableKernel final : public Kernel {
 public:
  UnavailableKernel(const std::string& name, std::string reason) : reason_(std::move(reason)) {
    description_.name = name;
    description_.summary = "unavailable here: " + reason_;
    description_.device = "cuda";  // the libraries adapted are GPU libraries
  }
  const KernelDescription& description() const override { return description_; }
  std::optional<std::string> unsupported_reason(const AttentionCall&) const override { return reason_; }
  std::unique_ptr<PreparedKernel> prepare(const AttentionCall&, const KernelOptions&) const override {
    throw KernelNotSupported(reason_);
  }

 private:
  KernelDescription description_;
  std::string reason_;
};

}  // namespace

const Kernel* unavailable_plugin_kernel(const std::string& name) {
  static std::mutex mutex;
  static std::vector<std::unique_ptr<Kernel>> made;  // for the process's life, as registered kernels are
  const std::lock_guard lock(mutex);
  for (const auto& kernel : made) {
    if (kernel->name() == name) return kernel.get();
  }
  for (const auto& [unavailable, reason] : unavailable_plugin_kernels()) {
    if (unavailable == name) return made.emplace_back(std::make_unique<UnavailableKernel>(name, reason)).get();
  }
  return nullptr;
}

bool plugin_code_loaded() { return loaded_plugin_code; }

void end_plugin_code() { run_python_exit_handlers(); }

}  // namespace attnreplay
