// attnreplay: replay captured (or generated) attention calls through every kernel and report
// speed beside error against an exact reference. Each command lives in its own file
// (replay/cli/*_command.cpp); this file only dispatches, and ends the process once a command is done.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "kernels/plugins.h"
#include "replay/cli/command.h"
#include "replay/measure/environment.h"
#include "replay/report/record_files.h"

namespace {

struct CommandEntry {
  const char* name;
  const char* summary;
  std::unique_ptr<attnreplay::Command> (*make)();
};

constexpr CommandEntry kCommands[] = {
    {"run", "replay calls through kernels; report time, TFLOP/s, GB/s and error", attnreplay::make_run_command},
    {"audit", "accuracy of kernels over a whole capture: error distributions, worst calls, verdicts",
     attnreplay::make_audit_command},
    {"merge", "join the parts of a sharded run into one record (JSON, CSV)", attnreplay::make_merge_command},
    {"compare", "two runs side by side: speed-ups beyond the noise, accuracy changes, regressions",
     attnreplay::make_compare_command},
    {"report", "one self-contained HTML page of runs' and audits' records: summary, charts, sortable tables",
     attnreplay::make_report_command},
    {"e2e", "run a job as is and with a kernel substituted for its attention; compare what it outputs, layer by layer",
     attnreplay::make_e2e_command},
    {"info", "what captures hold: calls, ops, shapes, dtypes, sizes", attnreplay::make_info_command},
    {"convert", "convert between .h5, .pt, .safetensors and .pt folders", attnreplay::make_convert_command},
    {"kernels", "list the kernels: built-in, plug-ins, and the library adapters", attnreplay::make_kernels_command},
    {"plot", "plots of an audit's JSON: error by call, layer and step; speed against accuracy",
     attnreplay::make_plot_command},
};

// A command's end. Where only attnreplay's own code ran, every file it wrote is closed by now: the
// process ends at once, without the teardown of libtorch's operator registry and CUDA's context,
// which takes 0.1-0.3 s on every run (docs/scaling.md). Plug-ins (a library's destructors,
// Python's exit handlers) and tools attached through CUDA's injection or a preload (Nsight Systems
// and Compute, compute-sanitizer, heaptrack) get the ordinary exit, in which they write what they hold.
int end_of_command(int status) {
  attnreplay::end_plugin_code();
  if (attnreplay::plugin_code_loaded() || std::getenv("CUDA_INJECTION64_PATH") || std::getenv("LD_PRELOAD")) {
    return status;
  }
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(status);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace attnreplay;
  CLI::App app{"attnreplay: benchmark and audit attention kernels on real captured tensors"};
  app.require_subcommand(1);
  app.set_version_flag("--version", tool_version());
  std::vector<std::pair<CLI::App*, std::unique_ptr<Command>>> commands;
  for (const CommandEntry& entry : kCommands) {
    CLI::App* subcommand = app.add_subcommand(entry.name, entry.summary);
    commands.emplace_back(subcommand, entry.make());
    commands.back().second->define(*subcommand);
  }
  // What follows "--" of a command that runs another is that program's, not ours to parse.
  int parsed = argc;
  for (const auto& [subcommand, command] : commands) {
    if (argc > 1 && subcommand->get_name() == argv[1] && command->takes_a_command()) {
      for (int i = 2; i < argc; ++i) {
        if (std::string_view(argv[i]) == "--") {
          parsed = i;
          break;
        }
      }
    }
  }
  try {
    app.parse(parsed, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    return code == 0 ? kExitOk : kExitUsage;
  }
  try {
    const auto chosen = std::find_if(commands.begin(), commands.end(), [](const auto& c) { return bool(*c.first); });
    if (chosen != commands.end()) {
      const int status = chosen->second->run(std::vector<std::string>(argv, argv + argc));
      commands.clear();  // what a command holds is closed before the process ends
      return end_of_command(status);
    }
  } catch (const UsageError& error) {
    std::cerr << "error: " << error.what() << '\n';
    return kExitUsage;
  } catch (const InputError& error) {
    std::cerr << "error: " << error.what() << '\n';
    return kExitFailures;
  } catch (const std::exception& error) {
    std::cerr << "internal error: " << error.what() << '\n';
    return kExitFailures;
  }
  return kExitUsage;
}
