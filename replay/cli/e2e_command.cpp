// `attnreplay e2e`: what substituting a kernel does to a job's own output (replay/run/end_to_end.h).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <iostream>

#include "replay/cli/command.h"
#include "replay/cli/program_prefix.h"
#include "replay/report/end_to_end_table.h"
#include "replay/report/record_files.h"
#include "replay/run/end_to_end.h"

namespace attnreplay {
namespace {
namespace fs = std::filesystem;

// libattncap.so of this build: capture/ in the build tree, or lib/ once installed.
std::string default_preload() {
  const fs::path installed = program_prefix() / "lib" / "libattncap.so";
  return (fs::exists(installed) ? installed : program_prefix() / "capture" / "libattncap.so").string();
}

class EndToEndCommand final : public Command {
 public:
  void define(CLI::App& app) override {
    app.add_option("--kernel", options_.kernel, "the kernel substituted for the job's attention (`attnreplay kernels`)")
        ->required();
    app.add_option("--outputs", options_.outputs,
                   "files the job writes (.npy, .pt, .safetensors): each run's are moved aside and compared");
    app.add_option("--workdir", options_.workdir, "each run's outputs, captures and logs (default: e2e_out)");
    app.add_option("--substitute-calls", options_.calls, "only these calls, e.g. 0-40,55 (ATTNCAP_SUBSTITUTE_CALLS)");
    app.add_option("--substitute-layers", options_.layers, "only these layers, e.g. 10-20 (ATTNCAP_SUBSTITUTE_LAYERS)");
    app.add_option("--substitute-steps", options_.steps, "only these steps, e.g. 0-4 (ATTNCAP_SUBSTITUTE_STEPS)");
    app.add_flag("!--no-layers", options_.per_layer,
                 "do not capture the runs (no per-layer view; the runs then cost what the job costs)");
    app.add_option("--preload", options_.preload, "libattncap.so (default: this build's)");
    app.add_option("--json", json_path_, "write the record");
    // Everything from the job's first word on is the job's, its own flags included ("--" optional).
    app.prefix_command();
    app.footer("The job's command comes last: attnreplay e2e --kernel K [flags] [--] JOB ARGS...");
    app_ = &app;
  }

  // main() leaves what follows "--" to the command: it is the job's.
  bool takes_a_command() const override { return true; }

  int run(const std::vector<std::string>& argv) override {
    // After "--", or, without it, from the job's first word on (CLI11 stops there).
    const auto dashes = std::find(argv.begin(), argv.end(), "--");
    options_.command = dashes != argv.end() ? std::vector<std::string>(dashes + 1, argv.end()) : app_->remaining();
    if (options_.command.empty()) throw UsageError("e2e: give the job's command last, e.g. -- python job.py");
    if (options_.workdir.empty()) options_.workdir = "e2e_out";
    if (options_.preload.empty()) options_.preload = default_preload();
    const nlohmann::json record = run_end_to_end(options_);
    if (!json_path_.empty()) {
      write_file_atomically(json_path_, [&](std::ostream& out) { out << record.dump(2) << '\n'; });
    }
    print_end_to_end(record, std::cout);
    return 0;
  }

 private:
  EndToEndOptions options_;
  std::string json_path_;
  CLI::App* app_ = nullptr;
};

}  // namespace

std::unique_ptr<Command> make_e2e_command() { return std::make_unique<EndToEndCommand>(); }

}  // namespace attnreplay
