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
    app.add_option("base", base_,
                   "the record to compare against (attnreplay run --json); repeated runs of it as RUN1,RUN2,...")
        ->required();
    app.add_option("new", change_, "the record of the change; repeated runs of it as RUN1,RUN2,...")->required();
    app.add_option("--threshold-diff", threshold_percent_,
                   "the smallest difference in percent that is called faster or slower (nvbench_compare's flag); a "
                   "row whose noise reaches it is too noisy to judge")
        ->check(CLI::Range(0.0, 1000.0))
        ->capture_default_str();
    app.add_option("--markdown", markdown_, "also write the comparison as Markdown (a pull request's comment)");
    app.add_option("--fail-on-regression", fail_percent_,
                   "exit 4 when a row is slower beyond the noise by more than PERCENT, less accurate, or failing "
                   "where it ran")
        ->check(CLI::Range(0.0, 1000.0));
    app.add_flag("-v,--verbose", every_row_, "list every (call, kernel), not only those that changed");
  }

  int run(const std::vector<std::string>&) override {
    const RunComparison comparison = compare_runs(runs_of(base_), runs_of(change_), threshold_percent_ / 100);
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
  // "a.json" or "a.json,b.json,...": one side's records, each read whole.
  static ComparedRuns runs_of(const std::string& names) {
    ComparedRuns runs{names, {}};
    std::size_t start = 0;
    while (start <= names.size()) {
      const std::size_t comma = names.find(',', start);
      const std::string name = names.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (!name.empty()) runs.records.push_back(read_record_file(name));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return runs;
  }

  std::string base_, change_, markdown_;
  double threshold_percent_ = kDefaultThresholdDiff * 100;
  std::optional<double> fail_percent_;
  bool every_row_ = false;
};

}  // namespace

std::unique_ptr<Command> make_compare_command() { return std::make_unique<CompareCommand>(); }

}  // namespace attnreplay
