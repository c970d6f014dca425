// `attnreplay plot AUDIT.json`: the audit's plots (scripts/plot_audit.py), drawn by the Python
// attnreplay was built with, whose venv has matplotlib, so that no other environment is needed.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include <unistd.h>

#include "replay/cli/command.h"
#include "replay/cli/program_prefix.h"

namespace attnreplay {
namespace {
namespace fs = std::filesystem;

// Beside an installed binary (share/attnreplay/python), else in the source tree it was built from.
std::string plot_script() {
  const fs::path installed = program_prefix() / "share" / "attnreplay" / "python" / "plot_audit.py";
  return fs::exists(installed) ? installed.string() : ATTNREPLAY_SOURCE_DIR "/scripts/plot_audit.py";
}

class PlotCommand final : public Command {
 public:
  void define(CLI::App& app) override {
    app.add_option("audit_json", audit_json_, "the file `attnreplay audit --json` wrote")->required();
    app.add_option("--out", out_, "folder for the PNG files (default: <json stem>_plots/ beside the JSON)");
  }

  int run(const std::vector<std::string>&) override {
    const char* chosen = std::getenv("ATTNREPLAY_PYTHON");
    const std::string python = chosen && *chosen ? chosen : ATTNREPLAY_PYTHON_EXECUTABLE;
    const std::string script = plot_script();
    std::vector<std::string> args{python, script, audit_json_};
    if (!out_.empty()) args.insert(args.end(), {"--out", out_});
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    execv(python.c_str(), argv.data());
    throw InputError(fmt::format("plot: cannot run {} (set ATTNREPLAY_PYTHON to a Python with matplotlib): {}", python,
                                 std::strerror(errno)));
  }

 private:
  std::string audit_json_, out_;
};

}  // namespace

std::unique_ptr<Command> make_plot_command() { return std::make_unique<PlotCommand>(); }

}  // namespace attnreplay
