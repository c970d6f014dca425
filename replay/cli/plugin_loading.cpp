#include "replay/cli/plugin_loading.h"

#include "kernels/plugins.h"
#include "replay/run/rerun.h"

namespace attnreplay {

LoadedPlugins load_plugin_files(const Options& options, bool with_adapters) {
  const PluginFiles files =
      with_environment_plugins({options.list("--kernel-module"), options.list("--kernel-library")});
  LoadedPlugins loaded;
  loaded.errors = load_plugins(files, with_adapters);
  for (const auto& module : files.modules) loaded.rerun_flags += " --kernel-module " + shell_quote(module);
  for (const auto& library : files.libraries) loaded.rerun_flags += " --kernel-library " + shell_quote(library);
  return loaded;
}

}  // namespace attnreplay
