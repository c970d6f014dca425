// `attnreplay audit`: how much accuracy each kernel loses over a whole capture (replay/run/audit.h),
// with the flags it shares with `run` from the same table.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <map>

#include <unistd.h>

#include "kernels/plugins.h"
#include "replay/cli/command.h"
#include "replay/cli/options.h"
#include "replay/cli/plugin_loading.h"
#include "replay/cli/run_configuration.h"
#include "replay/measure/environment.h"
#include "replay/report/printer.h"
#include "replay/report/record_files.h"
#include "replay/report/records.h"
#include "replay/run/audit.h"
#include "replay/run/sharding.h"

namespace attnreplay {
namespace {

class AuditCommand final : public Command {
 public:
  void define(CLI::App& app) override {
    app.add_option("inputs", inputs_, "capture files (.h5, .pt) or folders")->required();
    options_.define(app, kAuditUse);
  }

  int run(const std::vector<std::string>& argv) override {
    // An audit's distributions and verdicts are over the whole capture: one process makes them.
    if (const Shard launched = shard_from_launcher(process_environment()); launched.sharded()) {
      throw UsageError(fmt::format("audit: started as {}; an audit judges a whole capture in one process: start it "
                                   "once, or share the calls with `attnreplay run` under the launcher",
                                   launched.describe()));
    }
    const LoadedPlugins plugins = load_plugin_files(options_, selection_needs_python(options_.list("--kernels")));
    AuditReport report;
    report.replay.input_errors = plugins.errors;
    describe_run(report.replay, argv);
    AuditOptions options = audit_options(plugins);
    TimingGroups groups(static_cast<int>(*options_.integer("--timed-calls-per-group")));
    if (!options_.flag("--time-every-call")) options.replay.timing_groups = &groups;
    // Progress only where a person watches: scripts and tests read the table and the records.
    if (!options_.flag("--quiet") && isatty(STDERR_FILENO)) {
      options.progress = [](const std::string& line) { std::cerr << "audit: " << line << '\n'; };
    }
    report.replay.stopping_rule =
        "CPU " + options.replay.stopping.describe() + "; GPU " + options.replay.stopping_gpu.describe();

    run_audit(inputs_, options, report);

    for (const std::string& error : report.replay.input_errors) std::cerr << "error: " << error << '\n';
    nlohmann::json record = audit_to_json(report);
    // The table's values beside the audit's own record of its options, which stand.
    const nlohmann::json table_options = options_.to_json();
    for (const auto& [key, value] : table_options.items()) record["options"].emplace(key, value);
    write_outputs(record, output_files(options_.text("--json").value_or(""), options_.text("--csv").value_or(""),
                 options_.text("--html").value_or("")));
    if (!options_.flag("--quiet")) printer_for("table", record).print(record, std::cout);
    print_verdict_counts(report);
    if (report.replay.any_failed()) return kExitFailures;
    if (report.any_verdict_failed()) return kExitIncorrect;
    return kExitOk;
  }

 private:
  // Bad flags are usage errors (exit 2), found before any work.
  AuditOptions audit_options(const LoadedPlugins& plugins) const {
    AuditOptions a;
    try {
      a.replay = replay_options(options_, plugins.rerun_flags);
      if (!options_.flag("--full-timing")) {
        a.replay.stopping = audit_stopping_rule(/*gpu=*/false);
        a.replay.stopping_gpu = audit_stopping_rule(/*gpu=*/true);
        apply_stopping_flags(options_, a.replay.stopping);
        apply_stopping_flags(options_, a.replay.stopping_gpu);
      }
      a.wanted_calls = wanted_calls(options_);
      if (const auto cast = options_.text("--cast-inputs")) {
        const auto dtype = parse_dtype(*cast);
        if (!dtype || !dtype_is_floating(*dtype)) {
          throw InputError(fmt::format("--cast-inputs: expected a floating dtype ({}), got '{}'",
                                       fmt::join(floating_dtype_names(), ", "), *cast));
        }
        a.cast_inputs = *dtype;
      }
    } catch (const InputError& error) {
      throw UsageError(error.what());
    }
    a.worst_count = static_cast<int>(*options_.integer("--worst"));
    a.random_compare = options_.flag("--random-compare");
    a.random_seeds = static_cast<int>(*options_.integer("--random-seeds"));
    a.attribute = options_.flag("--attribute");
    a.audit_only_flags = options_.rerun_flags(kAuditUse, kRunUse);
    return a;
  }

  static void print_verdict_counts(const AuditReport& report) {
    std::map<std::string_view, int> verdicts;
    for (const KernelAudit& kernel : report.kernels) ++verdicts[verdict_name(kernel.verdict.verdict)];
    std::vector<std::string> parts;
    for (const auto& [name, count] : verdicts) parts.push_back(fmt::format("{} {}", count, name));
    std::cout << fmt::format("{} calls, {} kernels: {}; {} input errors\n", report.replay.calls.size(),
                             report.kernels.size(), parts.empty() ? "none" : fmt::format("{}", fmt::join(parts, ", ")),
                             report.replay.input_errors.size());
  }

  std::vector<std::string> inputs_;
  Options options_;
};

}  // namespace

std::unique_ptr<Command> make_audit_command() { return std::make_unique<AuditCommand>(); }

}  // namespace attnreplay
