#include "replay/run/kernel_selection.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "formats/errors.h"
#include "kernels/kernel.h"
#include "kernels/plugins.h"
#include "kernels/reference.h"

namespace attnreplay {

std::vector<const Kernel*> select_kernels(const std::vector<std::string>& names) {
  std::vector<const Kernel*> selected;
  auto add = [&selected](const Kernel* kernel) {
    if (std::find(selected.begin(), selected.end(), kernel) == selected.end()) selected.push_back(kernel);
  };
  const bool have_gpu = gpu_reference_available();
  for (const std::string& name : names) {
    if (name == "all" || name == "cpu" || name == "gpu") {
      for (const auto& kernel : KernelRegistry::instance().kernels()) {
        // The reference is what every kernel is judged by, computed for each call whatever is
        // selected: it is timed only when named.
        if (kernel->description().is_reference) continue;
        const bool on_gpu = kernel->description().device == "cuda";
        if (name == "cpu" ? !on_gpu : name == "gpu" ? on_gpu : on_gpu || !have_gpu) add(kernel.get());
      }
      continue;
    }
    const Kernel* kernel = KernelRegistry::instance().find(name);
    if (!kernel) kernel = unavailable_plugin_kernel(name);  // declines every call, saying why
    if (!kernel) {
      std::vector<std::string> known;
      for (const auto& k : KernelRegistry::instance().kernels()) known.push_back(k->name());
      throw InputError(fmt::format("--kernels: unknown kernel '{}' (known: {}, and the groups all, cpu, gpu)", name,
                                   fmt::join(known, ", ")));
    }
    add(kernel);
  }
  return selected;
}

}  // namespace attnreplay
