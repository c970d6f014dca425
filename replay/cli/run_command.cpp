// `attnreplay run`: replay captured or generated calls through the kernels, as one configuration
// of flags or one per line of a --testlist, alone or as this process's share under a launcher.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>

#include <unistd.h>

#include "formats/capture_source.h"
#include "formats/flashinfer_trace.h"
#include "kernels/plugins.h"
#include "replay/cli/command.h"
#include "replay/cli/options.h"
#include "replay/cli/plugin_loading.h"
#include "replay/cli/run_configuration.h"
#include "replay/measure/ceilings.h"
#include "replay/measure/environment.h"
#include "replay/measure/gpu.h"
#include "replay/measure/process_clock.h"
#include "replay/report/printer.h"
#include "replay/report/progress.h"
#include "replay/report/flashinfer_traces.h"
#include "replay/report/record_files.h"
#include "replay/report/records.h"
#include "replay/report/run_summary.h"
#include "replay/run/call_share.h"
#include "replay/run/kernel_selection.h"
#include "replay/run/replay_call.h"
#include "replay/run/local_ranks.h"
#include "replay/run/replay_capture.h"
#include "replay/run/sharded_run.h"

namespace attnreplay {
namespace {

// What every configuration of one run shares.
struct RunContext {
  Report& report;
  bool quiet = false;
  Ceilings ceilings;
  const LoadedPlugins& plugins;
  CallShare* share = nullptr;  // under a launcher: which calls are this process's
  bool every_kernel = false;   // -v: the kernels that refused a call in its table too
  std::string baseline;        // --baseline: what each call's times are relative to
};

// The table as each call finishes, and progress where a person watches: scripts and tests read the
// table and the records.
class CallDisplay {
 public:
  CallDisplay(bool quiet, bool every_kernel, std::string baseline)
      : quiet_(quiet), every_kernel_(every_kernel), baseline_(std::move(baseline)) {}
  ReplayProgress* progress() { return !quiet_ && isatty(STDERR_FILENO) ? &progress_ : nullptr; }
  void show(const CallResult& call) {
    progress_.clear();
    if (!quiet_) print_call_table(call_to_json(call), std::cout, every_kernel_, baseline_), std::cout.flush();
  }
  ~CallDisplay() { progress_.clear(); }

 private:
  bool quiet_, every_kernel_;
  std::string baseline_;
  ReplayProgress progress_{std::cerr};
};

// A generated call (`flags` rerun it), made only where this process's share takes it.
void replay_one_generated(const std::function<AttentionCall()>& make, const std::string& flags, const ReplayOptions& options,
                          RunContext& run, CallDisplay& display, CaptureWriter* saved_inputs) {
  if (run.share && !run.share->take_generated()) return;
  const double began_s = seconds_since_process_start();
  const AttentionCall call = make();
  if (saved_inputs) saved_inputs->append(call);
  CallResult result = replay_call(call, options, flags);
  display.show(result);
  result.replay_began_s = began_s;
  result.replay_ended_s = seconds_since_process_start();
  run.report.calls.push_back(std::move(result));
  if (run.share) run.share->replayed_generated();
}

void replay_generated(const Options& o, const ReplayOptions& options, RunContext& run, CallDisplay& display,
                      CaptureWriter* saved_inputs) {
  const auto [spec, flags] = generated_spec(o);
  replay_one_generated([&spec] { return generate_call(spec); }, flags, options, run, display, saved_inputs);
}

// FlashInfer's fi_trace dumps: a definition JSON, or a folder of only those (no workloads/), each
// one operation and shape with no tensors. Empty when `input` is not one.
std::vector<std::string> fi_trace_definitions(const std::string& input) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (fs::is_regular_file(input, error)) return fs::path(input).extension() == ".json" ? std::vector{input} : std::vector<std::string>{};
  if (!fs::is_directory(input, error) || looks_like_flashinfer_trace(input)) return {};
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(input, error)) {
    if (!entry.is_regular_file()) continue;
    if (entry.path().extension() != ".json") return {};
    files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

void replay_definitions(const std::vector<std::string>& files, const Options& o, const ReplayOptions& options,
                        RunContext& run, CallDisplay& display, CaptureWriter* saved_inputs) {
  for (const std::string& file : files) {
    try {
      const auto definition = read_flashinfer_definition(file);
      if (!definition) {
        run.report.input_errors.push_back(fmt::format("{}: a FlashInfer definition of no attention operation attnreplay "
                                                      "replays (gqa_ragged, gqa_paged, mla_paged)",
                                                      file));
        continue;
      }
      const auto [spec, flags] = generated_spec(o, *definition);
      const auto make = [&spec, &file, &definition] {
        AttentionCall call = generate_call(spec);
        call.source = file;
        call.metadata[kFlashInferDefinitionKey] = definition->name;
        return call;
      };
      replay_one_generated(make, flags, options, run, display, saved_inputs);
    } catch (const InputError& error) {
      run.report.input_errors.push_back(error.what());
    }
  }
}

// `definitions[i]`: input i's fi_trace dumps (fi_trace_definitions), listed once by the caller.
void replay_captures(const std::vector<std::string>& inputs, const std::vector<std::vector<std::string>>& definitions,
                     const Options& o, const ReplayOptions& options, RunContext& run, CallDisplay& display,
                     CaptureWriter* saved_inputs) {
  std::vector<std::unique_ptr<CaptureSource>> sources;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::string& input = inputs[i];
    if (!definitions[i].empty()) {
      replay_definitions(definitions[i], o, options, run, display, saved_inputs);
      continue;
    }
    try {
      sources.push_back(open_capture(input));
    } catch (const InputError& error) {
      run.report.input_errors.push_back(error.what());
    }
  }
  const auto selected = wanted_calls(o);
  std::vector<std::function<bool(std::int64_t)>> wanted(sources.size(), selected);
  if (run.share) {
    std::vector<CaptureSource*> listed;
    for (const auto& source : sources) listed.push_back(source.get());
    wanted = run.share->take_captured(listed, selected);
  }
  for (std::size_t s = 0; s < sources.size(); ++s) {
    // Each replayed call is saved as it is loaded for the replay: read once, and only the calls
    // --calls selects.
    auto save = [saved_inputs](const AttentionCall& call) { saved_inputs->append(call); };
    auto replayed = [&display, &run, s](const CallResult& call) {
      display.show(call);
      if (run.share) run.share->replayed(s, call.call_index);
    };
    try {
      replay_capture(*sources[s], wanted[s], options, run.report, replayed,
                     saved_inputs ? std::function<void(const AttentionCall&)>(save) : nullptr);
    } catch (const InputError& error) {
      run.report.input_errors.push_back(error.what());
    }
  }
}

// One configuration: a command line's flags, or a test-list line's. Problems with inputs are
// recorded, each prefixed with `place` (a test-list line) when given; bad flags throw.
void replay_configuration(const std::vector<std::string>& inputs, const Options& o, RunContext& run,
                          const std::string& place = {}) {
  ReplayOptions options = replay_options(o, run.plugins.rerun_flags);
  options.ceilings = run.ceilings;
  options.case_tag = o.text("--case_tag").value_or("");
  options.save_outputs_dir = o.text("--save-outputs").value_or("");
  TimingGroups groups(static_cast<int>(*o.integer("--timed-calls-per-group")));
  if (!o.flag("--time-every-call")) options.timing_groups = &groups;
  CallDisplay display(run.quiet, run.every_kernel, run.baseline);
  options.progress = display.progress();
  std::unique_ptr<CaptureWriter> saved_inputs;
  if (const auto path = o.text("--save-inputs")) saved_inputs = open_capture_writer(*path, "attnreplay run --save-inputs");
  // fi_trace dumps take the generation flags (--batch_size, --s_qo, ...) for their own calls.
  std::vector<std::vector<std::string>> definitions;
  for (const std::string& input : inputs) definitions.push_back(fi_trace_definitions(input));
  const bool definitions_given =
      std::any_of(definitions.begin(), definitions.end(), [](const auto& files) { return !files.empty(); });
  if (wants_generated(o) && !definitions_given) {
    replay_generated(o, options, run, display, saved_inputs.get());
  } else if (inputs.empty()) {
    throw InputError("nothing to replay: give capture files or folders, --shape, or --testlist");
  }
  const std::size_t first_error = run.report.input_errors.size();
  replay_captures(inputs, definitions, o, options, run, display, saved_inputs.get());
  if (saved_inputs) saved_inputs->close();
  if (!place.empty()) {
    for (std::size_t i = first_error; i < run.report.input_errors.size(); ++i) {
      run.report.input_errors[i] = place + ": " + run.report.input_errors[i];
    }
  }
}

// Each line of the file is the flags of one configuration (after an optional "attnreplay run");
// a line that fails is recorded with its place and the others run.
void replay_testlist(const std::string& path, RunContext& run) {
  std::ifstream in(path);
  if (!in) throw InputError(fmt::format("{}: cannot open test list", path));
  int line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    line = line.substr(first);
    for (const char* prefix : {"attnreplay run ", "run "}) {
      if (line.rfind(prefix, 0) == 0) line = line.substr(std::string_view(prefix).size());
    }
    const std::string where = fmt::format("{}:{}", path, line_number);
    try {
      CLI::App parser{"test-list line"};
      std::vector<std::string> inputs;
      parser.add_option("inputs", inputs);
      Options line_options;
      line_options.define(parser, kTestlistLineUse);
      parser.parse(line, false);
      if (!line_options.given("--case_tag")) line_options.set("--case_tag", where);
      replay_configuration(inputs, line_options, run, where);
    } catch (const CLI::Error& error) {
      run.report.input_errors.push_back(fmt::format("{}: {}", where, error.what()));
    } catch (const InputError& error) {
      run.report.input_errors.push_back(fmt::format("{}: {}", where, error.what()));
    }
  }
}

// The GPU's matrix and copy ceilings, into the environment record and, unless quiet, on stdout.
Ceilings measure_gpu_ceilings(Environment& environment, bool quiet) {
  const Ceilings ceilings = measure_ceilings();
  auto& v = environment.values;
  // 0: not measured (the operation failed, or a throttled GPU's timer kept no sample).
  const auto rate = [](double value, int decimals) {
    return value > 0 ? fmt::format("{:.{}f}", value, decimals) : std::string("not measured");
  };
  v["ceiling_bf16_tflops"] = rate(ceilings.bf16_tflops, 1);
  v["ceiling_fp8_tflops"] = rate(ceilings.fp8_tflops, 1);
  v["ceiling_int8_tops"] = rate(ceilings.int8_tops, 1);
  v["ceiling_copy_gbps"] = rate(ceilings.copy_gbps, 1);
  if (!quiet) {
    std::cout << fmt::format("{}: ceilings measured here: bf16 {} TFLOP/s, fp8 {} TFLOP/s, int8 {} TOPS, copy {} GB/s\n\n",
                             v["gpu"], rate(ceilings.bf16_tflops, 0), rate(ceilings.fp8_tflops, 0),
                             rate(ceilings.int8_tops, 0), rate(ceilings.copy_gbps, 0));
  }
  return ceilings;
}

class RunCommand final : public Command {
 public:
  void define(CLI::App& app) override {
    app.add_option("inputs", inputs_, "capture files (.h5, .pt) or folders of .pt calls");
    options_.define(app, kRunUse);
  }

  int run(const std::vector<std::string>& argv) override {
    Shard shard;
    try {
      shard = shard_from_flag(*options_.text("--shard"), process_environment());
    } catch (const InputError& error) {
      throw UsageError(error.what());
    }
    if (options_.given("--fib-traces") && (shard.sharded() || options_.integer("--gpus").value_or(1) > 1)) {
      throw UsageError("--fib-traces: written by one process; not with --gpus, --shard or a launcher's ranks");
    }
    if (const int gpus = static_cast<int>(options_.integer("--gpus").value_or(1)); gpus > 1) {
      check_local_ranks(gpus, shard);
      return run_local_ranks(gpus, argv);
    }
    const OutputFiles outputs = output_files(options_.text("--json").value_or(""), options_.text("--csv").value_or(""),
                 options_.text("--html").value_or(""));
    const bool quiet = options_.flag("--quiet");
    Report report;
    // Before anything touches CUDA: a shared run's process takes its local GPU.
    std::optional<ShardedRun> sharded;
    if (shard.sharded()) {
      const int timed_per_group =
          options_.flag("--time-every-call") ? 0 : static_cast<int>(*options_.integer("--timed-calls-per-group"));
      sharded.emplace(shard, timed_per_group, outputs, quiet, report);
    }
    // Before any kernel name is checked: plug-ins add names. The library adapters load where the
    // selection may want them (Python starts only then).
    const bool with_adapters = selection_needs_python(options_.list("--kernels")) || options_.given("--testlist");
    const LoadedPlugins plugins = load_plugin_files(options_, with_adapters);
    report.input_errors = plugins.errors;
    describe_run(report, argv);
    RunContext run{report, quiet, {}, plugins, sharded ? &sharded->share() : nullptr, options_.flag("--verbose"),
                   options_.text("--baseline").value_or("")};
    // The selected kernels start what they do beside the replay (a library's import) now, while the
    // GPU's ceilings are measured and the first calls read. A name that is no kernel's is said where
    // the calls are replayed.
    try {
      for (const Kernel* kernel : select_kernels(options_.list("--kernels"))) kernel->ready();
    } catch (const InputError&) {
    }
    if (!options_.flag("--no-ceilings") && gpu_present()) run.ceilings = measure_gpu_ceilings(report.environment, quiet);
    check_flags(report);
    if (const auto testlist = options_.text("--testlist")) replay_testlist(*testlist, run);
    if (!options_.given("--testlist") || wants_generated(options_) || !inputs_.empty()) {
      if (!wants_generated(options_) && inputs_.empty()) {
        throw UsageError("nothing to replay: give capture files or folders, --shape, or --testlist");
      }
      try {
        replay_configuration(inputs_, options_, run);
      } catch (const InputError& error) {
        report.input_errors.push_back(error.what());
      }
    }
    for (const std::string& error : report.input_errors) std::cerr << "error: " << error << '\n';
    for (const auto& kernel : KernelRegistry::instance().kernels()) {
      for (AheadCompilation& compilation : kernel->ahead_compilations()) {
        report.compilations_ahead.push_back(std::move(compilation));
      }
    }
    report.recorded_s = seconds_since_process_start();
    nlohmann::json record = report_to_json(report);
    record["options"] = options_.to_json();
    if (sharded) return sharded->finish(record, options_.number("--merge-wait"));
    write_outputs(record, outputs);
    if (const auto path = options_.text("--fib-traces")) write_fib_traces(record, *path);
    if (!quiet) std::cout << run_summary_text(record, options_.text("--baseline").value_or(""));
    print_summary(record);
    return exit_status(record);
  }

 private:
  // --gpus starts the ranks itself: not under another launcher, nor beyond the GPUs there are
  // (two processes timing on one GPU disturb each other's figures).
  void check_local_ranks(int gpus, const Shard& shard) const {
    if (shard.sharded()) {
      throw UsageError(fmt::format("--gpus {} starts its own processes, but this one is already rank {} of {} ({}): "
                                   "give --gpus or a launcher, not both",
                                   gpus, shard.rank, shard.world_size, shard.launcher));
    }
    const int visible = gpu_count();
    if (visible > 0 && gpus > visible) {
      throw UsageError(fmt::format("--gpus {}: this machine shows {} GPU{} (CUDA_VISIBLE_DEVICES limits them)", gpus,
                                   visible, visible == 1 ? "" : "s"));
    }
  }

  void write_fib_traces(const nlohmann::json& record, const std::string& path) const {
    const FlashInferTraces traces = flashinfer_traces(record, options_.text("--baseline").value_or(""));
    std::ofstream out(path, std::ios::trunc);
    for (const std::string& line : traces.lines) out << line << '\n';
    if (!out.flush()) throw InputError(fmt::format("{}: cannot write", path));
    std::cout << fmt::format("{}: {} FlashInfer-Bench trace{}\n", path, traces.lines.size(), traces.lines.size() == 1 ? "" : "s");
    for (const std::string& note : traces.notes) std::cout << "  " << note << '\n';
  }

  // Bad flags on the command line are usage errors (exit 2), found before any work.
  void check_flags(Report& report) const {
    try {
      const ReplayOptions options = replay_options(options_, "");
      report.stopping_rule = "CPU " + options.stopping.describe() + "; GPU " + options.stopping_gpu.describe();
      if (wants_generated(options_)) generated_spec(options_);
      wanted_calls(options_);
    } catch (const InputError& error) {
      throw UsageError(error.what());
    }
  }

  std::vector<std::string> inputs_;
  Options options_;
};

}  // namespace

std::unique_ptr<Command> make_run_command() { return std::make_unique<RunCommand>(); }

}  // namespace attnreplay
