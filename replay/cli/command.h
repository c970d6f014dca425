#pragma once
// One subcommand of attnreplay, in a file of its own: it defines its flags on its CLI11 subcommand
// and runs once the command line is parsed. replay/cli/main.cpp holds the table of them and only
// dispatches.
#include <memory>
#include <string>
#include <vector>

#include "formats/errors.h"

namespace CLI {
class App;
}

namespace attnreplay {

// A flag that cannot work, as opposed to an input that turned out bad: exit code 2.
class UsageError : public InputError {
 public:
  using InputError::InputError;
};

class Command {
 public:
  virtual ~Command() = default;
  // Adds the command's flags and positional arguments to its subcommand.
  virtual void define(CLI::App& app) = 0;
  // Runs it; `argv` is the whole command line, for the records. Returns the exit code; throws
  // UsageError or InputError, which main() reports in one line.
  virtual int run(const std::vector<std::string>& argv) = 0;
  // A command that runs another program (e2e) takes it after "--": main() parses only what comes
  // before, and run() finds the rest in argv.
  virtual bool takes_a_command() const { return false; }
};

std::unique_ptr<Command> make_run_command();
std::unique_ptr<Command> make_audit_command();
std::unique_ptr<Command> make_merge_command();
std::unique_ptr<Command> make_compare_command();
std::unique_ptr<Command> make_info_command();
std::unique_ptr<Command> make_convert_command();
std::unique_ptr<Command> make_kernels_command();
std::unique_ptr<Command> make_plot_command();
std::unique_ptr<Command> make_report_command();
std::unique_ptr<Command> make_e2e_command();

}  // namespace attnreplay
