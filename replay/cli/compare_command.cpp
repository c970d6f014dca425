// `attnreplay compare BASE.json NEW.json`: two runs' records side by side, per (call, kernel) and
// per kernel, with verdicts beyond both runs' noise (replay/judge/run_comparison.h); a CI gate
// with --fail-on-regression.
#include <CLI/CLI.hpp>

#include <iostream>

#include "replay/cli/command.h"
#include "replay/judge/run_comparison.h"
#include "replay/report/comparison_report.h"
#include "replay/report/record_files.h"

namespace attnreplay {
namespace {

class CompareCommand final : public Command {
 public:
  void define(CLI::App& app) override {
    app.add_option("base", base_, "the record to compare against (attnreplay run --json)")->required();
    app.add_option("new", change_, "the record of the change")->required();
    app.add_option("--markdown", markdown_, "also write the comparison as Markdown (a pull request's comment)");
    app.add_option("--fail-on-regression", fail_percent_,
                   "exit 4 when a row is slower beyond the noise by more than PERCENT, less accurate, or failing "
                   "where it ran")
        ->check(CLI::Range(0.0, 1000.0));
    app.add_flag("-v,--verbose", every_row_, "list every (call, kernel), not only those that changed");
  }

  int run(const std::vector<std::string>&) override {
    const RunComparison comparison =
        compare_runs(read_record_file(base_), base_, read_record_file(change_), change_);
    ComparisonView view;
    view.every_row = every_row_;
    if (fail_percent_) view.fail_percent = *fail_percent_;
    std::cout << comparison_text(comparison, view);
    if (!markdown_.empty()) {
      write_file_atomically(markdown_, [&](std::ostream& out) { out << comparison_markdown(comparison, view); });
    }
    if (!fail_percent_) return kExitOk;
    for (const ComparedRow& row : comparison.rows) {
      if (regresses(row, *fail_percent_)) return kExitRegression;
    }
    return kExitOk;
  }

 private:
  std::string base_, change_, markdown_;
  std::optional<double> fail_percent_;
  bool every_row_ = false;
};

}  // namespace

std::unique_ptr<Command> make_compare_command() { return std::make_unique<CompareCommand>(); }

}  // namespace attnreplay
