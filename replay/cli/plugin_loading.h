#pragma once
// The plug-ins a command loads (--kernel-module, --kernel-library and their environment variables;
// the library adapters where the kernels asked for may need them), before any kernel name is
// checked: plug-ins add names.
#include <string>
#include <vector>

#include "replay/cli/options.h"

namespace attnreplay {

struct LoadedPlugins {
  // The flags that load them again, for every rerun command.
  std::string rerun_flags;
  // The files that failed to load, each naming the file: input errors of the run (exit 1) while the
  // other kernels run.
  std::vector<std::string> errors;
};

// Loads the plug-in files `options` names and the environment adds; with `with_adapters`, also the
// adapters of the attention libraries installed here (Python starts only then).
LoadedPlugins load_plugin_files(const Options& options, bool with_adapters);

}  // namespace attnreplay
