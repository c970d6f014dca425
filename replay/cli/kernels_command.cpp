// `attnreplay kernels`: every registered kernel (built-in, plug-ins with their files, the library
// adapters) and those that cannot run here, with why.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <iostream>

#include "kernels/kernel.h"
#include "kernels/plugins.h"
#include "replay/cli/command.h"
#include "replay/cli/options.h"
#include "replay/cli/plugin_loading.h"
#include "replay/report/record_files.h"

namespace attnreplay {
namespace {

class KernelsCommand final : public Command {
 public:
  void define(CLI::App& app) override { options_.define(app, kKernelsUse); }

  int run(const std::vector<std::string>&) override {
    const LoadedPlugins plugins = load_plugin_files(options_, /*with_adapters=*/true);
    const auto& registry = KernelRegistry::instance();
    const auto unavailable = unavailable_plugin_kernels();
    // One column of names, as wide as the longest (some adapters' names run past 20).
    std::size_t width = 20;
    for (const auto& kernel : registry.kernels()) width = std::max(width, kernel->name().size());
    for (const auto& [name, reason] : unavailable) width = std::max(width, name.size());
    for (const auto& kernel : registry.kernels()) {
      const auto& d = kernel->description();
      std::cout << fmt::format("{:<{}} {:<5} {}\n", d.name, width, d.device, d.summary);
      const std::string source = registry.source_of(d.name);
      if (source != "built-in") std::cout << fmt::format("{:<{}} from {}\n", "", width + 6, source);
    }
    if (!unavailable.empty()) std::cout << "\nunavailable here:\n";
    for (const auto& [name, reason] : unavailable) std::cout << fmt::format("{:<{}} {}\n", name, width, reason);
    for (const std::string& error : plugins.errors) std::cerr << "error: " << error << '\n';
    return plugins.errors.empty() ? kExitOk : kExitFailures;
  }

 private:
  Options options_;
};

}  // namespace

std::unique_ptr<Command> make_kernels_command() { return std::make_unique<KernelsCommand>(); }

}  // namespace attnreplay
