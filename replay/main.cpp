// attnreplay: replay captured (or generated) attention calls through every kernel and report
// speed beside error against an exact reference.
#include <CLI/CLI.hpp>
#include <fmt/chrono.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <unistd.h>

#include "formats/capture_source.h"
#include "formats/errors.h"
#include "kernels/kernel.h"
#include "kernels/plugins.h"
#include "kernels/quantized_attention.h"
#include "replay/audit.h"
#include "replay/call_share.h"
#include "replay/environment.h"
#ifdef ATTNREPLAY_HAVE_CUDA
#include "replay/ceilings.h"
#include "replay/cuda_timing.h"
#endif
#include "replay/generate.h"
#include "replay/merge.h"
#include "replay/record_files.h"
#include "replay/report.h"
#include "replay/runner.h"
#include "replay/sharded_run.h"
#include "replay/sharding.h"

namespace attnreplay {
namespace {
namespace fs = std::filesystem;

// A flag that cannot work, as opposed to an input that turned out bad.
class UsageError : public InputError {
 public:
  using InputError::InputError;
};

// The flags of one `run`: what a command line or one line of a --testlist gives.
struct RunArgs {
  std::vector<std::string> inputs;
  std::string shape;
  std::optional<std::int64_t> batch_size, num_qo_heads, num_kv_heads, s_qo, s_kv, head_dim_qk, head_dim_vo;
  std::string dtype = "bfloat16";
  std::string layout = "bhsd";
  bool causal = false;
  std::string causal_alignment = "top_left";
  std::optional<double> scale;
  std::string routine;  // FlashInfer's batch routines (replay/generate.h)
  std::int64_t page_size = 0;
  bool random_actual_seq_len = false;
  std::uint64_t seed = 0;
  std::vector<std::string> kernels{"all"};
  std::string calls;
  std::int64_t ref_sample_rows = 0;
  bool refcheck = false;
  std::optional<double> refcheck_min_cosine, refcheck_max_rel_l2, refcheck_max_abs;
  // Unset: the device's default (StoppingRule for CPU kernels, gpu_default() for GPU kernels).
  std::optional<int> warmup, min_samples;
  std::optional<double> min_time, max_noise_percent, timeout;
  // Calls of one shape share a timing (replay/timing_groups.h): this many are timed per group.
  int timed_calls_per_group = 1;
  bool time_every_call = false;
  std::string case_tag;
  std::string save_outputs;
  std::string save_inputs;
  std::string reference = "auto";
  bool hot_l2 = false;
  std::optional<std::uint64_t> prefetch_mib;  // unset: default_prefetch_bytes()
  std::string timing = "event";  // --timing: checked by the parser and again by replay_options()
  // The quantized kernels' options (docs/quantized.md); values are checked by the parser.
  std::string quant_gran = "per_warp";
  bool no_k_smooth = false;
  std::string pv_accum_dtype = "fp32+fp32";
  std::string fp8_scale = "per_head";
};

// The flags come in groups, so that `audit` defines the ones it shares with `run` by the same code.
void add_generated_options(CLI::App& app, RunArgs& a) {
  app.add_option("--shape", a.shape, "generated inputs: batch,heads,seq,head_dim (e.g. 2,24,4250,64)");
  app.add_option("--batch_size", a.batch_size, "generated: batch (overrides --shape)");
  app.add_option("--num_qo_heads", a.num_qo_heads, "generated: query heads");
  app.add_option("--num_kv_heads", a.num_kv_heads, "generated: key/value heads (GQA when fewer)");
  app.add_option("--s_qo", a.s_qo, "generated: query length");
  app.add_option("--s_kv", a.s_kv, "generated: key/value length");
  app.add_option("--head_dim_qk", a.head_dim_qk, "generated: head dim of Q and K");
  app.add_option("--head_dim_vo", a.head_dim_vo, "generated: head dim of V and O");
  app.add_option("--dtype", a.dtype, "generated: bf16, fp16, fp32, fp64, fp8")->capture_default_str();
  app.add_option("--layout", a.layout, "generated: bhsd or bshd")->capture_default_str();
  app.add_flag("--causal", a.causal, "generated: causal");
  app.add_option("--causal_alignment", a.causal_alignment, "generated: top_left (SDPA) or bottom_right (flash-attn)")
      ->capture_default_str();
  app.add_option("--scale", a.scale, "generated: softmax scale (default 1/sqrt(head_dim_qk))");
  app.add_option("--routine", a.routine,
                 "generated: a batch of sequences as FlashInfer's benchmark routine makes it: "
                 "BatchPrefillWithRaggedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper or "
                 "BatchDecodeWithPagedKVCacheWrapper (--batch_size sequences, causal bottom-right)");
  app.add_option("--page_size", a.page_size, "generated: tokens per KV-cache page (the paged routines)");
  app.add_flag("--random_actual_seq_len", a.random_actual_seq_len,
               "generated: each sequence's keys drawn from 1..s_kv and its queries from 1..min(s_qo, its keys)");
}

void add_selection_options(CLI::App& app, RunArgs& a) {
  app.add_option("--seed,--random_seed", a.seed, "seed for generated inputs and sampled rows")->capture_default_str();
  app.add_option("--kernels,--backends", a.kernels, "kernels to run, comma-separated, or all")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--calls", a.calls, "call indices to replay, e.g. 0-40,55");
  app.add_option("--ref-sample-rows", a.ref_sample_rows,
                 "compare only this many random query rows per head (0: all); the full reference is then skipped");
}

void add_refcheck_options(CLI::App& app, RunArgs& a) {
  app.add_flag("--refcheck", a.refcheck, "judge errors against thresholds; exit 3 when one is exceeded");
  app.add_option("--refcheck-min-cosine", a.refcheck_min_cosine, "threshold (implies --refcheck)");
  app.add_option("--refcheck-max-rel-l2", a.refcheck_max_rel_l2, "threshold (implies --refcheck)");
  app.add_option("--refcheck-max-abs", a.refcheck_max_abs, "threshold (implies --refcheck)");
}

void add_stopping_options(CLI::App& app, RunArgs& a) {
  app.add_option("--warmup", a.warmup, "warm-up runs (CPU 1, GPU 3)");
  app.add_option("--min-samples", a.min_samples, "fewest timed samples (CPU 5, GPU 10)");
  app.add_option("--min-time", a.min_time, "least seconds of timed samples (CPU 0.1, GPU 0.5)");
  app.add_option("--max-noise", a.max_noise_percent, "stop once the samples' robust spread (1.4826 MAD / median) is under this percentage, or the "
                 "median's standard error under a tenth of it (CPU 2, GPU 0.5)");
  app.add_option("--timeout", a.timeout, "most seconds of sampling per call and kernel (CPU 5, GPU 15)");
  app.add_option("--timed-calls-per-group", a.timed_calls_per_group,
                 "calls whose timing cannot differ (same shape, dtypes, layout, strides, mask, causality) share "
                 "one: this many of each group are timed, the others judged only")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--time-every-call", a.time_every_call, "time every call, however many share a shape");
}

void add_device_options(CLI::App& app, RunArgs& a) {
  app.add_option("--reference", a.reference, "where the fp64 reference runs: cpu, cuda, or auto (the GPU if present)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  app.add_flag("--hot-l2", a.hot_l2, "GPU samples without flushing the L2 cache first (default: cold L2)");
  app.add_option("--prefetch-memory", a.prefetch_mib,
                 "MiB that calls read ahead of the one replayed may hold, it included (default: 4096, or a quarter "
                 "of the memory where less)")
      ->check(CLI::PositiveNumber);
  app.add_option("--timing", a.timing,
                 "how GPU kernels are timed: event (CUDA events around each run), graph (CUDA graph of K runs, "
                 "hot L2), cupti (kernel durations CUPTI records), queued (events around runs queued back to back, "
                 "unheld: triton's do_bench method)")
      ->check(CLI::IsMember(timing_method_names()))
      ->capture_default_str();
}

void add_quant_options(CLI::App& app, RunArgs& a) {
  app.add_option("--quant_gran", a.quant_gran, "quantized kernels: rows sharing an INT8 scale (Sage)")
      ->check(CLI::IsMember(quant_granularity_names()))
      ->capture_default_str();
  app.add_flag("--no_k_smooth", a.no_k_smooth, "quantized kernels: do not subtract K's channel means (Sage)");
  app.add_option("--pv_accum_dtype", a.pv_accum_dtype, "quantized kernels: Sage2's P·V accumulation")
      ->check(CLI::IsMember(pv_accum_names()))
      ->capture_default_str();
  app.add_option("--fp8_scale", a.fp8_scale, "quantized kernels: FA3-FP8's scale granularity")
      ->check(CLI::IsMember(fp8_scale_names()))
      ->capture_default_str();
}

void add_run_options(CLI::App& app, RunArgs& a) {
  app.add_option("inputs", a.inputs, "capture files (.h5, .pt) or folders of .pt calls");
  add_generated_options(app, a);
  add_selection_options(app, a);
  add_refcheck_options(app, a);
  add_stopping_options(app, a);
  app.add_option("--case_tag", a.case_tag, "a label carried into every row");
  app.add_option("--save-outputs", a.save_outputs, "folder for each kernel's output (.pt per call and kernel)");
  app.add_option("--save-inputs", a.save_inputs, "write the replayed calls to this capture (.h5, .pt or folder/)");
  add_device_options(app, a);
  add_quant_options(app, a);
}

// Throws InputError for a value the parser's check let through (a test-list line is parsed too).
QuantOptions quant_options_from(const RunArgs& a) {
  QuantOptions o;
  const auto granularity = parse_quant_granularity(a.quant_gran);
  if (!granularity) throw InputError(fmt::format("--quant_gran: expected per_block, per_warp or per_thread, got '{}'", a.quant_gran));
  const auto accumulation = parse_pv_accum(a.pv_accum_dtype);
  if (!accumulation) throw InputError(fmt::format("--pv_accum_dtype: expected fp32, fp32+fp32 or fp32+fp16, got '{}'", a.pv_accum_dtype));
  const auto fp8_scale = parse_fp8_scale(a.fp8_scale);
  if (!fp8_scale) throw InputError(fmt::format("--fp8_scale: expected per_tensor or per_head, got '{}'", a.fp8_scale));
  o.quant_gran = *granularity;
  o.k_smooth = !a.no_k_smooth;
  o.pv_accum = *accumulation;
  o.fp8_scale = *fp8_scale;
  return o;
}

std::vector<std::int64_t> parse_ints(const std::string& text, const std::string& flag) {
  std::vector<std::int64_t> values;
  std::stringstream stream(text);
  for (std::string part; std::getline(stream, part, ',');) {
    try {
      std::size_t used = 0;
      values.push_back(std::stoll(part, &used));
      if (used != part.size()) throw std::invalid_argument(part);
    } catch (const std::exception&) {
      throw InputError(fmt::format("{}: expected integers, got '{}'", flag, text));
    }
  }
  return values;
}

// "0-40,55" -> predicate on call indices.
std::function<bool(std::int64_t)> parse_call_ranges(const std::string& text) {
  if (text.empty()) return {};
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  std::stringstream stream(text);
  for (std::string part; std::getline(stream, part, ',');) {
    const auto dash = part.find('-', 1);
    try {
      if (dash == std::string::npos) ranges.emplace_back(std::stoll(part), std::stoll(part));
      else ranges.emplace_back(std::stoll(part.substr(0, dash)), std::stoll(part.substr(dash + 1)));
    } catch (const std::exception&) {
      throw InputError(fmt::format("--calls: expected ranges like 0-40,55, got '{}'", text));
    }
  }
  return [ranges](std::int64_t index) {
    for (const auto& [low, high] : ranges)
      if (index >= low && index <= high) return true;
    return false;
  };
}

std::string format_number(double value) { return fmt::format("{:g}", value); }

// The stopping-rule flags given on top of `rule`'s own values.
void apply_stopping_flags(const RunArgs& a, StoppingRule& rule) {
  if (a.warmup) rule.warmup_runs = *a.warmup;
  if (a.min_samples) rule.min_samples = *a.min_samples;
  if (a.min_time) rule.min_time_s = *a.min_time;
  if (a.max_noise_percent) rule.max_noise = *a.max_noise_percent / 100.0;
  if (a.timeout) rule.timeout_s = *a.timeout;
}

ReplayOptions replay_options(const RunArgs& a) {
  ReplayOptions o;
  o.kernels = a.kernels;
  select_kernels(o.kernels);  // unknown names fail before any work
  o.stopping_gpu = StoppingRule::gpu_default();
  apply_stopping_flags(a, o.stopping);
  apply_stopping_flags(a, o.stopping_gpu);
  o.ref_sample_rows = a.ref_sample_rows;
  o.seed = a.seed;
  if (a.refcheck || a.refcheck_min_cosine || a.refcheck_max_rel_l2 || a.refcheck_max_abs) {
    o.refcheck = RefcheckThresholds{a.refcheck_min_cosine, a.refcheck_max_rel_l2, a.refcheck_max_abs};
  }
  o.save_outputs_dir = a.save_outputs;
  o.case_tag = a.case_tag;
  o.reference_device = a.reference;
  o.hot_l2 = a.hot_l2;
  if (a.prefetch_mib) o.prefetch_bytes = *a.prefetch_mib << 20;
  const auto timing = parse_timing_method(a.timing);
  if (!timing) throw InputError(fmt::format("--timing: expected event, graph or cupti, got '{}'", a.timing));
  o.timing = *timing;
  o.quant = quant_options_from(a);
  // The flags that change results, so that each row's rerun command reproduces it.
  std::string& r = o.rerun_base;
  // (The row-sampling seed goes in per call: a generated call's flags carry it already.)
  if (a.ref_sample_rows > 0) r += fmt::format(" --ref-sample-rows {}", a.ref_sample_rows);
  if (o.refcheck) r += " --refcheck";
  if (a.refcheck_min_cosine) r += " --refcheck-min-cosine " + format_number(*a.refcheck_min_cosine);
  if (a.refcheck_max_rel_l2) r += " --refcheck-max-rel-l2 " + format_number(*a.refcheck_max_rel_l2);
  if (a.refcheck_max_abs) r += " --refcheck-max-abs " + format_number(*a.refcheck_max_abs);
  if (a.warmup) r += fmt::format(" --warmup {}", *a.warmup);
  if (a.min_samples) r += fmt::format(" --min-samples {}", *a.min_samples);
  if (a.min_time) r += " --min-time " + format_number(*a.min_time);
  if (a.timeout) r += " --timeout " + format_number(*a.timeout);
  if (a.max_noise_percent) r += " --max-noise " + format_number(*a.max_noise_percent);
  if (a.reference != "auto") r += " --reference " + a.reference;
  if (a.hot_l2) r += " --hot-l2";
  if (o.timing != TimingMethod::event) r += fmt::format(" --timing {}", timing_method_flag(o.timing));
  r += quant_option_flags(o.quant);
  return o;
}

bool wants_generated(const RunArgs& a) {
  return !a.shape.empty() || a.batch_size || a.num_qo_heads || a.s_qo || a.head_dim_qk || !a.routine.empty();
}

// The generated call's description and the flags that regenerate it; throws on bad flags.
std::pair<GeneratedCallSpec, std::string> generated_spec(const RunArgs& a) {
  GeneratedCallSpec spec;
  AttentionShape& s = spec.shape;
  s = {1, 1, 0, 128, 0, 64, 0};
  if (!a.shape.empty()) {
    const auto dims = parse_ints(a.shape, "--shape");
    if (dims.size() != 4) throw InputError(fmt::format("--shape: expected batch,heads,seq,head_dim, got '{}'", a.shape));
    s.batch = dims[0], s.heads_q = dims[1], s.seq_q = dims[2], s.head_dim_qk = dims[3];
  }
  if (a.batch_size) s.batch = *a.batch_size;
  if (a.num_qo_heads) s.heads_q = *a.num_qo_heads;
  if (a.s_qo) s.seq_q = *a.s_qo;
  if (a.head_dim_qk) s.head_dim_qk = *a.head_dim_qk;
  s.heads_kv = a.num_kv_heads.value_or(s.heads_q);
  s.seq_kv = a.s_kv.value_or(s.seq_q);
  s.head_dim_vo = a.head_dim_vo.value_or(s.head_dim_qk);
  const auto dtype = parse_dtype(a.dtype);
  if (!dtype) throw InputError(fmt::format("--dtype: unknown dtype '{}'", a.dtype));
  const auto layout = parse_layout(a.layout);
  if (!layout) throw InputError(fmt::format("--layout: expected bhsd, bshd or thd, got '{}'", a.layout));
  const auto alignment = parse_causal_alignment(a.causal_alignment);
  if (!alignment) throw InputError(fmt::format("--causal_alignment: expected top_left or bottom_right, got '{}'", a.causal_alignment));
  if (s.heads_kv <= 0 || s.heads_q % s.heads_kv != 0) {
    throw InputError(fmt::format("--num_kv_heads: {} does not divide {} query heads", s.heads_kv, s.heads_q));
  }
  spec.dtype = *dtype;
  spec.layout = *layout;
  spec.is_causal = a.causal;
  spec.causal_alignment = *alignment;
  spec.scale = a.scale;
  spec.seed = a.seed;
  if (!a.routine.empty()) {
    const auto routine = parse_batch_routine(a.routine);
    if (!routine) {
      throw InputError(fmt::format("--routine: expected BatchPrefillWithRaggedKVCacheWrapper, "
                                   "BatchPrefillWithPagedKVCacheWrapper or BatchDecodeWithPagedKVCacheWrapper, got '{}'",
                                   a.routine));
    }
    spec.routine = *routine;
    spec.page_size = a.page_size;
    spec.random_actual_seq_len = a.random_actual_seq_len;
    spec.layout = Layout::thd;
    spec.causal_alignment = CausalAlignment::bottom_right;
  } else if (spec.layout == Layout::thd) {
    throw InputError("--layout thd: a ragged batch is generated by --routine");
  } else if (a.page_size || a.random_actual_seq_len) {
    throw InputError(fmt::format("{}: only a --routine generates sequences", a.page_size ? "--page_size" : "--random_actual_seq_len"));
  }
  return {spec, generated_call_flags(spec)};
}

struct Output {
  bool quiet = false;
  Ceilings ceilings;
};

// The plug-ins this command loaded: the flags that load them again (for every rerun command) and
// the ones that failed, which are input errors of the run (exit 1) while the other kernels run.
struct LoadedPlugins {
  std::string rerun_flags;
  std::vector<std::string> errors;
};

void add_plugin_options(CLI::App& app, PluginFiles& files) {
  app.add_option("--kernel-module", files.modules,
                 "a Python file or module of plug-in kernels (docs/plugins.md); repeatable; also "
                 "$ATTNREPLAY_KERNEL_MODULES, ':'-separated");
  app.add_option("--kernel-library", files.libraries,
                 "a shared library of C++/CUDA plug-in kernels (docs/plugins.md); repeatable; also "
                 "$ATTNREPLAY_KERNEL_LIBRARIES");
}

LoadedPlugins load_plugin_files(const PluginFiles& given, bool with_adapters) {
  const PluginFiles files = with_environment_plugins(given);
  LoadedPlugins loaded;
  loaded.errors = load_plugins(files, with_adapters);
  for (const auto& module : files.modules) loaded.rerun_flags += " --kernel-module " + shell_quote(module);
  for (const auto& library : files.libraries) loaded.rerun_flags += " --kernel-library " + shell_quote(library);
  return loaded;
}

// Runs one set of run flags into `report`. Problems with inputs are recorded, each prefixed with
// `place` (a test-list line) when given; bad flags throw. Under a launcher, `share` picks this
// process's calls.
void run_one(const RunArgs& a, Report& report, const Output& output, const LoadedPlugins& plugins, CallShare* share,
             const std::string& place = {}) {
  ReplayOptions options = replay_options(a);
  options.ceilings = output.ceilings;
  options.rerun_base += plugins.rerun_flags;
  TimingGroups groups(a.timed_calls_per_group);
  if (!a.time_every_call) options.timing_groups = &groups;
  // Progress only where a person watches: scripts and tests read the table and the records.
  ReplayProgress progress(std::cerr);
  if (!output.quiet && isatty(STDERR_FILENO)) options.progress = &progress;
  auto show = [&output, &progress](const CallResult& call) {
    progress.clear();
    if (!output.quiet) print_call_table(call, std::cout), std::cout.flush();
  };
  std::unique_ptr<CaptureWriter> saved_inputs;
  if (!a.save_inputs.empty()) saved_inputs = open_capture_writer(a.save_inputs, "attnreplay run --save-inputs");
  if (wants_generated(a)) {
    const auto [spec, flags] = generated_spec(a);
    if (!share || share->take_generated()) {
      const AttentionCall call = generate_call(spec);
      if (saved_inputs) saved_inputs->append(call);
      CallResult result = replay_call(call, options, flags);
      show(result);
      report.calls.push_back(std::move(result));
      if (share) share->replayed_generated();
    }
  } else if (a.inputs.empty()) {
    throw InputError("nothing to replay: give capture files or folders, --shape, or --testlist");
  }
  const std::size_t first_error = report.input_errors.size();
  std::vector<std::unique_ptr<CaptureSource>> sources;
  for (const std::string& input : a.inputs) {
    try {
      sources.push_back(open_capture(input));
    } catch (const InputError& error) {
      report.input_errors.push_back(error.what());
    }
  }
  const auto selected = parse_call_ranges(a.calls);
  std::vector<std::function<bool(std::int64_t)>> wanted(sources.size(), selected);
  if (share) {
    std::vector<CaptureSource*> listed;
    for (const auto& source : sources) listed.push_back(source.get());
    wanted = share->take_captured(listed, selected);
  }
  for (std::size_t s = 0; s < sources.size(); ++s) {
    // Each replayed call is saved as it is loaded for the replay: read once, and only the calls
    // --calls selects.
    auto save = [&saved_inputs](const AttentionCall& call) { saved_inputs->append(call); };
    auto replayed = [&show, share, s](const CallResult& call) {
      show(call);
      if (share) share->replayed(s, call.call_index);
    };
    try {
      replay_capture(*sources[s], wanted[s], options, report, replayed,
                     saved_inputs ? std::function<void(const AttentionCall&)>(save) : nullptr);
    } catch (const InputError& error) {
      report.input_errors.push_back(error.what());
    }
  }
  progress.clear();
  if (saved_inputs) saved_inputs->close();
  if (!place.empty()) {
    for (std::size_t i = first_error; i < report.input_errors.size(); ++i) {
      report.input_errors[i] = place + ": " + report.input_errors[i];
    }
  }
}

std::string now_utc() {
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(now));
}

// How `run` shares its calls among processes (replay/sharding.h).
struct ShardArgs {
  std::string shard = "auto";
  std::optional<double> merge_wait_s;  // unset: twice rank 0's own time, plus a minute
};

int command_run(const RunArgs& args, const std::string& testlist, const std::string& json_path,
                const std::string& csv_path, Output output, bool measure_gpu_ceilings, const LoadedPlugins& plugins,
                const std::vector<std::string>& argv, const ShardArgs& sharding) {
  Shard shard;
  try {
    shard = shard_from_flag(sharding.shard, process_environment());
  } catch (const InputError& error) {
    throw UsageError(error.what());
  }
  Report report;
  // Before anything touches CUDA: a shared run's process takes its local GPU.
  std::optional<ShardedRun> sharded;
  if (shard.sharded()) {
    sharded.emplace(shard, args.time_every_call ? 0 : args.timed_calls_per_group, json_path, csv_path, output.quiet,
                    report);
  }
  CallShare* share = sharded ? &sharded->share() : nullptr;
  report.input_errors = plugins.errors;
  report.tool_version = tool_version();
  report.argv = argv;
  report.started_utc = now_utc();
  report.environment = describe_environment();
#ifdef ATTNREPLAY_HAVE_CUDA
  if (cuda_device_present()) describe_torch_cuda(report.environment);
  if (measure_gpu_ceilings && cuda_device_present()) {
    output.ceilings = measure_ceilings();
    auto& v = report.environment.values;
    // 0: not measured (the operation failed, or a throttled GPU's timer kept no sample).
    const auto rate = [](double value, int decimals) {
      return value > 0 ? fmt::format("{:.{}f}", value, decimals) : std::string("not measured");
    };
    v["ceiling_bf16_tflops"] = rate(output.ceilings.bf16_tflops, 1);
    v["ceiling_fp8_tflops"] = rate(output.ceilings.fp8_tflops, 1);
    v["ceiling_int8_tops"] = rate(output.ceilings.int8_tops, 1);
    v["ceiling_copy_gbps"] = rate(output.ceilings.copy_gbps, 1);
    if (!output.quiet) {
      std::cout << fmt::format("{}: ceilings measured here: bf16 {} TFLOP/s, fp8 {} TFLOP/s, int8 {} TOPS, "
                               "copy {} GB/s\n\n", v["gpu"], rate(output.ceilings.bf16_tflops, 0),
                               rate(output.ceilings.fp8_tflops, 0), rate(output.ceilings.int8_tops, 0),
                               rate(output.ceilings.copy_gbps, 0));
    }
  }
#else
  (void)measure_gpu_ceilings;
#endif
  // Bad flags on the command line are usage errors (exit 2), found before any work.
  try {
    const ReplayOptions options = replay_options(args);
    report.stopping_rule = "CPU " + options.stopping.describe() + "; GPU " + options.stopping_gpu.describe();
    if (wants_generated(args)) generated_spec(args);
    parse_call_ranges(args.calls);
  } catch (const InputError& error) {
    throw UsageError(error.what());
  }
  if (!testlist.empty()) {
    std::ifstream in(testlist);
    if (!in) throw InputError(fmt::format("{}: cannot open test list", testlist));
    int line_number = 0;
    for (std::string line; std::getline(in, line);) {
      ++line_number;
      const auto first = line.find_first_not_of(" \t\r");
      if (first == std::string::npos || line[first] == '#') continue;
      line = line.substr(first);
      for (const char* prefix : {"attnreplay run ", "run "}) {
        if (line.rfind(prefix, 0) == 0) line = line.substr(std::string_view(prefix).size());
      }
      const std::string where = fmt::format("{}:{}", testlist, line_number);
      try {
        RunArgs line_args;
        CLI::App parser{"test-list line"};
        add_run_options(parser, line_args);
        parser.parse(line, false);
        if (line_args.case_tag.empty()) line_args.case_tag = where;
        run_one(line_args, report, output, plugins, share, where);
      } catch (const CLI::Error& error) {
        report.input_errors.push_back(fmt::format("{}: {}", where, error.what()));
      } catch (const InputError& error) {
        report.input_errors.push_back(fmt::format("{}: {}", where, error.what()));
      }
    }
  }
  if (testlist.empty() || wants_generated(args) || !args.inputs.empty()) {
    if (!wants_generated(args) && args.inputs.empty()) {
      throw UsageError("nothing to replay: give capture files or folders, --shape, or --testlist");
    }
    try {
      run_one(args, report, output, plugins, share);
    } catch (const InputError& error) {
      report.input_errors.push_back(error.what());
    }
  }
  for (const std::string& error : report.input_errors) std::cerr << "error: " << error << '\n';
  if (sharded) return sharded->finish(report, sharding.merge_wait_s);
  if (!json_path.empty()) write_file_atomically(json_path, [&](std::ostream& out) { write_json(report, out); });
  if (!csv_path.empty()) write_file_atomically(csv_path, [&](std::ostream& out) { write_csv(report, out); });
  const nlohmann::json record = report_to_json(report);
  print_summary(record);
  return exit_status(record);
}

int command_info(const std::vector<std::string>& inputs) {
  int status = kExitOk;
  for (const std::string& input : inputs) {
    try {
      auto source = open_capture(input);
      std::map<std::string, int> ops;
      std::uint64_t bytes = 0;
      std::cout << fmt::format("{}: {}, {} calls\n", input, source->format(), source->size());
      std::cout << fmt::format("  {:>6}  {:<44} {:<14} {:<6} {:<38} {:<12} {:<16} {:>10}\n", "call", "op (backend)",
                               "dtype", "layout", "shape", "causal", "mask", "bytes");
      for (const std::string& error : source->open_errors()) {
        std::cout << "  error: " << error << '\n';
        status = kExitFailures;
      }
      for (std::size_t i = 0; i < source->size(); ++i) {
        try {
          const AttentionCall call = source->load(i, /*with_data=*/false);
          std::uint64_t call_bytes = call.q.nbytes() + call.k.nbytes() + call.v.nbytes();
          if (call.mask) call_bytes += call.mask->nbytes();
          if (call.out) call_bytes += call.out->nbytes();
          bytes += call_bytes;
          ++ops[call.op];
          const std::string op = call.backend.empty() ? call.op : fmt::format("{} ({})", call.op, call.backend);
          std::cout << fmt::format("  {:>6}  {:<44} {:<14} {:<6} {:<38} {:<12} {:<16} {:>10}\n", call.call_index, op,
                                   dtype_name(call.q.dtype), layout_name(call.layout), call.shape().to_string(),
                                   call.is_causal ? causal_alignment_name(call.causal_alignment) : "no",
                                   call.mask ? fmt::format("{} {}", dtype_name(call.mask->dtype), shape_string(call.mask->shape)) : "none",
                                   call_bytes);
          std::string meta;
          for (const auto& [key, value] : call.metadata) meta += fmt::format(" {}={}", key, value);
          if (!meta.empty()) std::cout << "          " << meta << '\n';
        } catch (const InputError& error) {
          std::cout << "  error: " << error.what() << '\n';
          status = kExitFailures;
        }
      }
      for (const auto& [op, count] : ops) std::cout << fmt::format("  {} x {}\n", count, op.empty() ? "(no op)" : op);
      std::cout << fmt::format("  tensor bytes: {}\n", bytes);
    } catch (const InputError& error) {
      std::cerr << "error: " << error.what() << '\n';
      status = kExitFailures;
    }
  }
  return status;
}

int command_convert(const std::string& from, const std::string& to) {
  auto source = open_capture(from);
  auto writer = open_capture_writer(to, "attnreplay convert");
  int written = 0;
  int status = kExitOk;
  for (const std::string& error : source->open_errors()) {
    std::cerr << "error: " << error << '\n';
    status = kExitFailures;
  }
  for (std::size_t i = 0; i < source->size(); ++i) {
    try {
      writer->append(source->load(i));
      ++written;
    } catch (const InputError& error) {
      std::cerr << "error: " << error.what() << " (skipped)\n";
      status = kExitFailures;
    }
  }
  writer->close();
  std::cout << fmt::format("{}: {} of {} calls written\n", to, written, source->size());
  return status;
}

int command_kernels(const LoadedPlugins& plugins) {
  const auto& registry = KernelRegistry::instance();
  for (const auto& kernel : registry.kernels()) {
    const auto& d = kernel->description();
    std::cout << fmt::format("{:<20} {:<5} {}\n", d.name, d.device, d.summary);
    const std::string source = registry.source_of(d.name);
    if (source != "built-in") std::cout << fmt::format("{:<26} from {}\n", "", source);
  }
  const auto unavailable = unavailable_plugin_kernels();
  if (!unavailable.empty()) std::cout << "\nunavailable here:\n";
  for (const auto& [name, reason] : unavailable) std::cout << fmt::format("{:<20} {}\n", name, reason);
  for (const std::string& error : plugins.errors) std::cerr << "error: " << error << '\n';
  return plugins.errors.empty() ? kExitOk : kExitFailures;
}

int command_merge(const std::vector<std::string>& parts, const std::string& json_path, const std::string& csv_path) {
  if (json_path.empty() && csv_path.empty()) throw UsageError("merge: give --json or --csv (or both) to write");
  const nlohmann::json joined = merge_parts(parts);
  for (const auto& error : joined["input_errors"]) std::cerr << "error: " << error.get<std::string>() << '\n';
  return write_joined_record(joined, parts.size(), json_path, csv_path);
}

// The flags of `audit`: the ones it shares with `run`, defined by the same code, and its own.
struct AuditArgs {
  RunArgs run;
  int worst = 5;
  bool random_compare = false;
  int random_seeds = 3;
  bool attribute = false;
  bool full_timing = false;
  std::string cast_inputs;
  std::string json_path, csv_path;
  bool quiet = false;
};

void add_audit_options(CLI::App& app, AuditArgs& a) {
  app.add_option("inputs", a.run.inputs, "capture files (.h5, .pt) or folders")->required();
  add_selection_options(app, a.run);
  add_refcheck_options(app, a.run);
  add_stopping_options(app, a.run);
  add_device_options(app, a.run);
  add_quant_options(app, a.run);
  app.add_option("--worst", a.worst, "worst calls (by rel_l2) listed per kernel, with per-head errors")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--random-compare", a.random_compare,
               "also run the kernels on random inputs of each captured shape, beside the captured calls' errors");
  app.add_option("--random-seeds", a.random_seeds,
                 "random calls per shape for --random-compare (seeds --seed, --seed + 1, ...): their median and range")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--attribute", a.attribute,
               "for the worst calls of the emulated quantized kernels: the error with each quantization step, "
               "and input diagnostics (K channel means, INT8 amax spread) for every call");
  app.add_flag("--full-timing", a.full_timing, "time with run's stopping rule (default: a quick one, a few samples)");
  app.add_option("--cast-inputs", a.cast_inputs,
                 "round captured Q, K, V to this dtype first (bf16, fp16), as a model run in it would give them");
  app.add_option("--json", a.json_path, "write the complete audit record");
  app.add_option("--csv", a.csv_path, "write one row per call and kernel");
  app.add_flag("-q,--quiet", a.quiet, "print only the summary line");
}

int command_audit(const AuditArgs& a, const LoadedPlugins& plugins, const std::vector<std::string>& argv) {
  // An audit's distributions and verdicts are over the whole capture: one process makes them.
  if (const Shard launched = shard_from_launcher(process_environment()); launched.sharded()) {
    throw UsageError(fmt::format("audit: started as {}; an audit judges a whole capture in one process: start it "
                                 "once, or share the calls with `attnreplay run` under the launcher",
                                 launched.describe()));
  }
  AuditReport report;
  report.replay.input_errors = plugins.errors;
  report.replay.tool_version = tool_version();
  report.replay.argv = argv;
  report.replay.started_utc = now_utc();
  report.replay.environment = describe_environment();
#ifdef ATTNREPLAY_HAVE_CUDA
  if (cuda_device_present()) describe_torch_cuda(report.replay.environment);
#endif
  AuditOptions options;
  // Bad flags are usage errors (exit 2), found before any work.
  try {
    options.replay = replay_options(a.run);
    options.replay.rerun_base += plugins.rerun_flags;
    if (!a.full_timing) {
      options.replay.stopping = audit_stopping_rule(/*gpu=*/false);
      options.replay.stopping_gpu = audit_stopping_rule(/*gpu=*/true);
      apply_stopping_flags(a.run, options.replay.stopping);
      apply_stopping_flags(a.run, options.replay.stopping_gpu);
    }
    options.wanted_calls = parse_call_ranges(a.run.calls);
    if (!a.cast_inputs.empty()) {
      const auto dtype = parse_dtype(a.cast_inputs);
      if (!dtype || !dtype_is_floating(*dtype)) {
        throw InputError(fmt::format("--cast-inputs: expected a floating dtype (bf16, fp16, ...), got '{}'", a.cast_inputs));
      }
      options.cast_inputs = *dtype;
    }
  } catch (const InputError& error) {
    throw UsageError(error.what());
  }
  TimingGroups groups(a.run.timed_calls_per_group);
  if (!a.run.time_every_call) options.replay.timing_groups = &groups;
  options.worst_count = a.worst;
  options.random_compare = a.random_compare;
  options.random_seeds = a.random_seeds;
  options.attribute = a.attribute;
  if (a.full_timing) options.audit_only_flags = " --full-timing";
  // Progress only where a person watches: scripts and tests read the table and the records.
  if (!a.quiet && isatty(STDERR_FILENO)) {
    options.progress = [](const std::string& line) { std::cerr << "audit: " << line << '\n'; };
  }
  report.replay.stopping_rule =
      "CPU " + options.replay.stopping.describe() + "; GPU " + options.replay.stopping_gpu.describe();

  run_audit(a.run.inputs, options, report);

  for (const std::string& error : report.replay.input_errors) std::cerr << "error: " << error << '\n';
  if (!a.json_path.empty()) write_file_atomically(a.json_path, [&](std::ostream& out) { write_audit_json(report, out); });
  if (!a.csv_path.empty()) write_file_atomically(a.csv_path, [&](std::ostream& out) { write_audit_csv(report, out); });
  if (!a.quiet) print_audit_table(report, std::cout);
  std::map<std::string_view, int> verdicts;
  for (const KernelAudit& kernel : report.kernels) ++verdicts[verdict_name(kernel.verdict.verdict)];
  std::vector<std::string> parts;
  for (const auto& [name, count] : verdicts) parts.push_back(fmt::format("{} {}", count, name));
  std::cout << fmt::format("{} calls, {} kernels: {}; {} input errors\n", report.replay.calls.size(), report.kernels.size(),
                           parts.empty() ? "none" : fmt::format("{}", fmt::join(parts, ", ")),
                           report.replay.input_errors.size());
  if (report.replay.any_failed()) return kExitFailures;
  if (report.any_verdict_failed()) return kExitIncorrect;
  return kExitOk;
}

}  // namespace
}  // namespace attnreplay

int main(int argc, char** argv) {
  using namespace attnreplay;
  CLI::App app{"attnreplay: benchmark and audit attention kernels on real captured tensors"};
  app.require_subcommand(1);
  app.set_version_flag("--version", tool_version());

  RunArgs run_args;
  std::string testlist, json_path, csv_path;
  Output output;
  CLI::App* run = app.add_subcommand("run", "replay calls through kernels; report time, TFLOP/s, GB/s and error");
  add_run_options(*run, run_args);
  run->add_option("--testlist", testlist, "file of run flags, one configuration a line (# comments)");
  run->add_option("--json", json_path, "write the complete results record");
  run->add_option("--csv", csv_path, "write one row per call and kernel");
  run->add_flag("-q,--quiet", output.quiet, "print only the summary");
  bool no_ceilings = false;
  PluginFiles plugin_files;
  add_plugin_options(*run, plugin_files);
  run->add_flag("--no-ceilings", no_ceilings, "skip measuring the GPU's matrix and copy ceilings at start-up");
  ShardArgs shard_args;
  run->add_option("--shard", shard_args.shard,
                  "share the calls among processes: auto (the launcher's ranks: torchrun, srun, mpirun, Slurm "
                  "arrays), none, or RANK/SIZE; each writes its part of --json/--csv (docs/scaling.md)")
      ->capture_default_str();
  run->add_option("--merge-wait", shard_args.merge_wait_s,
                  "sharded: seconds rank 0 waits for the other parts to join them (default: twice its own time "
                  "plus 60; 0: leave them to attnreplay merge)")
      ->check(CLI::NonNegativeNumber);

  std::vector<std::string> merge_inputs;
  std::string merge_json, merge_csv;
  CLI::App* merge = app.add_subcommand("merge", "join the parts of a sharded run into one record (JSON, CSV)");
  merge->add_option("parts", merge_inputs, "the parts' JSON files (out.part*-of-N.json)")->required();
  merge->add_option("--json", merge_json, "write the joined record");
  merge->add_option("--csv", merge_csv, "write one row per call and kernel");

  std::vector<std::string> info_inputs;
  CLI::App* info = app.add_subcommand("info", "what captures hold: calls, ops, shapes, dtypes, sizes");
  info->add_option("inputs", info_inputs, "capture files or folders")->required();

  std::string convert_from, convert_to;
  CLI::App* convert = app.add_subcommand("convert", "convert between .h5, .pt and .pt folders");
  convert->add_option("from", convert_from, "capture to read")->required();
  convert->add_option("to", convert_to, "capture to write: .h5, .pt, or a folder ending in '/'")->required();

  CLI::App* kernels = app.add_subcommand("kernels", "list the kernels: built-in, plug-ins, and the library adapters");
  add_plugin_options(*kernels, plugin_files);

  AuditArgs audit_args;
  CLI::App* audit = app.add_subcommand(
      "audit", "accuracy of kernels over a whole capture: error distributions, worst calls, verdicts");
  add_audit_options(*audit, audit_args);
  add_plugin_options(*audit, plugin_files);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    return code == 0 ? 0 : kExitUsage;
  }
  try {
    // Before any kernel name is checked: plug-ins add names. The library adapters load where the
    // selection may want them (Python starts only then).
    const bool with_adapters = *kernels || (*run && (selection_needs_python(run_args.kernels) || !testlist.empty())) ||
                               (*audit && selection_needs_python(audit_args.run.kernels));
    const LoadedPlugins plugins =
        *run || *kernels || *audit ? load_plugin_files(plugin_files, with_adapters) : LoadedPlugins{};
    if (*run) {
      return command_run(run_args, testlist, json_path, csv_path, output, !no_ceilings, plugins,
                         std::vector<std::string>(argv, argv + argc), shard_args);
    }
    if (*merge) return command_merge(merge_inputs, merge_json, merge_csv);
    if (*info) return command_info(info_inputs);
    if (*convert) return command_convert(convert_from, convert_to);
    if (*kernels) return command_kernels(plugins);
    if (*audit) return command_audit(audit_args, plugins, std::vector<std::string>(argv, argv + argc));
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
