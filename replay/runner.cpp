#include "replay/runner.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <mutex>

#include <unistd.h>

#include "formats/errors.h"
#include "formats/pt_format.h"
#include "kernels/device_output.h"
#include "kernels/kernel.h"
#include "kernels/per_sequence.h"
#include "kernels/reference.h"
#include "kernels/torch_inputs.h"
#include "replay/call_semantics.h"
#include "replay/prefetch.h"
#ifdef ATTNREPLAY_HAVE_CUDA
#include "replay/cuda_timing.h"
#endif

namespace attnreplay {
namespace fs = std::filesystem;

std::string_view disposition_name(Disposition disposition) {
  switch (disposition) {
    case Disposition::passed: return "passed";
    case Disposition::incorrect: return "incorrect";
    case Disposition::not_verified: return "not_verified";
    case Disposition::not_supported: return "not_supported";
    case Disposition::failed: return "failed";
  }
  return "?";
}

double Ceilings::matrix_tflops_for(DType dtype) const {
  switch (dtype) {
    case DType::bfloat16:
    case DType::float16: return bf16_tflops;  // fp16 and bf16 share the tensor cores' rate
    case DType::float8_e4m3fn:
    case DType::float8_e5m2: return fp8_tflops;
    case DType::int8: return int8_tops;
    default: return 0;
  }
}

std::optional<double> KernelResult::preparation_s() const {
  if (!timing_of_preparation || timing_of_preparation->untimed()) return std::nullopt;
  return timing_of_preparation->median_s;
}

std::optional<double> KernelResult::preparation_ratio() const {
  const auto seconds = preparation_s();
  if (!seconds || !preparation || preparation->bound_s <= 0) return std::nullopt;
  return *seconds / preparation->bound_s;
}

bool Report::any_failed() const {
  if (!input_errors.empty()) return true;
  for (const auto& call : calls)
    for (const auto& kernel : call.kernels)
      if (kernel.disposition == Disposition::failed) return true;
  return false;
}

std::uint64_t default_prefetch_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
  const std::uint64_t quarter = pages > 0 && page_size > 0 ? static_cast<std::uint64_t>(pages) * page_size / 4 : 0;
  constexpr std::uint64_t kFourGiB = 4ull << 30;
  return quarter > 0 ? std::min(quarter, kFourGiB) : kFourGiB;
}

std::string shell_quote(const std::string& text) {
  if (!text.empty() && text.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=,:@%+") ==
                           std::string::npos) {
    return text;
  }
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::vector<const Kernel*> select_kernels(const std::vector<std::string>& names) {
  std::vector<const Kernel*> selected;
  auto add = [&selected](const Kernel* kernel) {
    if (std::find(selected.begin(), selected.end(), kernel) == selected.end()) selected.push_back(kernel);
  };
  // On a GPU machine "all" means its GPU kernels: the CPU ones (emulations, torch's CPU backends)
  // would take minutes on GPU-sized calls; "cpu" and "gpu" name each group.
  const bool have_gpu = gpu_reference_available();
  for (const std::string& name : names) {
    if (name == "all" || name == "cpu" || name == "gpu") {
      for (const auto& kernel : KernelRegistry::instance().kernels()) {
        const bool on_gpu = kernel->description().device == "cuda";
        if (name == "cpu" ? !on_gpu : name == "gpu" ? on_gpu : on_gpu || !have_gpu) add(kernel.get());
      }
      continue;
    }
    const Kernel* kernel = KernelRegistry::instance().find(name);
    if (!kernel) {
      std::vector<std::string> known;
      for (const auto& k : KernelRegistry::instance().kernels()) known.push_back(k->name());
      throw InputError(
          fmt::format("--kernels: unknown kernel '{}' (known: {}, and the groups all, cpu, gpu)", name, fmt::join(known, ", ")));
    }
    add(kernel);
  }
  return selected;
}

// Defaults sit well outside what a correct kernel's rounding gives at each input precision
// (unit roundoff: bf16 3.9e-3, fp16 4.9e-4, fp32 6e-8) and well inside what a bug gives.
RefcheckLimits refcheck_limits(const RefcheckThresholds& asked, DType dtype) {
  RefcheckLimits t{0.999, 3e-2, asked.max_abs};
  switch (dtype) {
    case DType::float64: t.min_cosine = 1 - 1e-12, t.max_rel_l2 = 1e-10; break;
    case DType::float32: t.min_cosine = 1 - 1e-8, t.max_rel_l2 = 1e-5; break;
    case DType::float16: t.max_rel_l2 = 5e-3; break;
    case DType::bfloat16: t.max_rel_l2 = 3e-2; break;
    default: t.min_cosine = 0.99, t.max_rel_l2 = 0.15; break;  // fp8 inputs, or int8 and fp8 kernels
  }
  if (asked.min_cosine) t.min_cosine = *asked.min_cosine;
  if (asked.max_rel_l2) t.max_rel_l2 = *asked.max_rel_l2;
  return t;
}

namespace {

bool uses_gpu_reference(const ReplayOptions& options) {
  return options.reference_device == "cuda" || (options.reference_device == "auto" && gpu_reference_available());
}

void judge(KernelResult& result, const ReplayOptions& options, DType dtype) {
  if (!options.refcheck) {
    result.disposition = Disposition::not_verified;
    return;
  }
  const RefcheckLimits t = refcheck_limits(*options.refcheck, dtype);
  const ErrorStats& e = *result.error;
  if (e.nan_count > 0) result.refcheck_failures.push_back(fmt::format("{} NaN", e.nan_count));
  if (e.inf_count > 0) result.refcheck_failures.push_back(fmt::format("{} Inf", e.inf_count));
  if (!(e.cosine >= t.min_cosine))
    result.refcheck_failures.push_back(fmt::format("cosine {:.8g} < {:.8g}", e.cosine, t.min_cosine));
  if (!(e.rel_l2 <= t.max_rel_l2))
    result.refcheck_failures.push_back(fmt::format("rel_l2 {:.3g} > {:.3g}", e.rel_l2, t.max_rel_l2));
  if (t.max_abs && !(e.max_abs <= *t.max_abs))
    result.refcheck_failures.push_back(fmt::format("max_abs {:.3g} > {:.3g}", e.max_abs, *t.max_abs));
  result.disposition = result.refcheck_failures.empty() ? Disposition::passed : Disposition::incorrect;
}

std::string describe_mask(const std::optional<HostTensor>& mask) {
  if (!mask) return "none";
  return fmt::format("{} {}", dtype_name(mask->dtype), shape_string(mask->shape));
}

std::string safe_file_part(std::string text) {
  for (char& c : text) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
  }
  return text;
}

// A kernel's input preparation as a run of its own, followed by the kernel or alone.
class PreparationRun final : public PreparedKernel {
 public:
  PreparationRun(PreparedKernel& kernel, bool with_kernel) : kernel_(kernel), with_kernel_(with_kernel) {}
  void run() override {
    kernel_.prepare_inputs();
    if (with_kernel_) kernel_.run();
  }
  void synchronize() override { kernel_.synchronize(); }
  HostTensor output() override { return kernel_.output(); }
  bool runs_on_current_stream() const override { return kernel_.runs_on_current_stream(); }

 private:
  PreparedKernel& kernel_;
  bool with_kernel_;
};

// One timer per device kind and GPU method, made on first use (the CUDA ones allocate an L2 flush
// buffer). A method that cannot work here throws, and each GPU row says why.
SampleTimer& timer_for(const KernelDescription& kernel, const ReplayOptions& options) {
  static CpuClockTimer cpu_timer;
  if (kernel.device != "cuda") return cpu_timer;
#ifdef ATTNREPLAY_HAVE_CUDA
  static std::map<std::pair<TimingMethod, bool>, std::unique_ptr<SampleTimer>> cuda_timers;
  auto& timer = cuda_timers[{options.timing, options.hot_l2}];
  if (!timer) timer = make_cuda_timer(CudaTimerOptions{!options.hot_l2, 0.75, options.timing});
  if (timer) return *timer;
#endif
  throw std::runtime_error("CUDA timing is not available in this build");
}

// What reads the clocks while a kernel's samples run: NVML for GPU kernels, where it loads.
ClockMonitor* monitor_for(const KernelDescription& kernel) {
#ifdef ATTNREPLAY_HAVE_CUDA
  if (kernel.device == "cuda") return gpu_clock_monitor();
#endif
  static_cast<void>(kernel);
  return nullptr;
}

}  // namespace

ReferenceOutput reference_for(const AttentionCall& call, const ReplayOptions& options) {
  std::vector<std::int64_t> rows;
  const std::int64_t seq_q = call.shape().seq_q;
  if (options.ref_sample_rows > 0 && options.ref_sample_rows < seq_q) {
    rows = sample_query_rows(seq_q, options.ref_sample_rows, options.seed ^ static_cast<std::uint64_t>(call.call_index));
  }
  ReferenceOutput reference;
  if (!uses_gpu_reference(options)) {
    reference = reference_attention(call, rows);
  } else {
    if (!gpu_reference_available()) throw InputError("--reference cuda: no CUDA device");
    // Kept on the GPU: kernels' outputs are compared there (replay/error_stats.h).
    reference = reference_attention_gpu(call, rows, /*keep_on_device=*/true);
  }
  mark_rows_without_keys(call, reference);
  return reference;
}

BytePool::Hooks read_ahead_memory(const ReplayOptions& options) {
  if (!gpu_reference_available()) return {};
  bool to_gpu = uses_gpu_reference(options);
  for (const Kernel* kernel : select_kernels(options.kernels)) to_gpu = to_gpu || kernel->description().device == "cuda";
  return to_gpu ? pinned_memory(current_gpu().index()) : BytePool::Hooks{};
}

// An untimed kernel's figures are NaN, shown as "-" and null. stderr says so once a process too,
// since a table may not be printed.
std::optional<std::string> untimed_note(const KernelResult& k) {
  std::vector<std::string> untimed;
  const TimingSummary* first = nullptr;
  const std::pair<const std::optional<TimingSummary>*, const char*> timings[] = {
      {&k.timing, "alone"}, {&k.timing_with_preparation, "with its input preparation"},
      {&k.timing_of_preparation, "its input preparation alone"}};
  for (const auto& [timing, what] : timings) {
    if (!*timing || !(*timing)->untimed()) continue;
    untimed.emplace_back(what);
    if (!first) first = &**timing;
  }
  if (!first) return std::nullopt;
  std::string note = fmt::format("{} ({}): {}", k.kernel, fmt::join(untimed, ", "), untimed_reason(*first));
  static std::once_flag warned;
  std::call_once(warned, [&note] { std::cerr << "attnreplay: warning: " << note << '\n'; });
  return note;
}

CallResult replay_call(const AttentionCall& captured, const ReplayOptions& options, const std::string& rerun_input) {
  CallResult result;
  result.source = captured.source;
  result.call_index = captured.call_index;
  result.op = captured.op;
  result.backend = captured.backend;
  result.shape = captured.shape();
  result.dtype = std::string(dtype_name(captured.q.dtype));
  result.layout = captured.layout;
  result.is_causal = captured.is_causal;
  result.causal_alignment = captured.causal_alignment;
  result.mask = describe_mask(captured.mask);
  for (const auto extension : captured.extensions()) result.extensions.push_back(captured.describe(extension));
  result.batching = captured.describe_batch();
  if (captured.is_ragged()) {
    for (const auto& sequence : captured.sequences()) result.sequence_lengths.emplace_back(sequence.q_len, sequence.k_len);
  }
  result.scale = captured.softmax_scale();
  result.metadata = captured.metadata;
  result.case_tag = options.case_tag;
  result.work = attention_work(captured);
  result.quant_options = options.quant;
  // Kernels prepare a call from the call alone, so the quantized ones read the run's options here.
  set_quant_options(options.quant);

  // An argument the replay cannot honour (a sliding window, a softcap, ...) would make every kernel
  // be judged against the wrong answer: the call is refused, loudly, kernel by kernel.
  if (const auto refused = unreplayable_arguments(captured); !refused.empty()) {
    const std::string reason = fmt::format("not replayed: the call has {}, which the replay cannot honour",
                                           fmt::join(refused, ", "));
    result.notes.push_back(reason);
    for (const Kernel* kernel : select_kernels(options.kernels)) {
      KernelResult k;
      k.kernel = kernel->name();
      k.source = KernelRegistry::instance().source_of(k.kernel);
      k.work = result.work;
      k.disposition = Disposition::not_supported;
      k.reason = reason;
      result.kernels.push_back(std::move(k));
    }
    return result;
  }
  AttentionCall call = captured;
  if (call.dropout_p > 0) {
    result.notes.push_back(fmt::format("captured with dropout_p={}; replayed without dropout", call.dropout_p));
    call.dropout_p = 0;
  }
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); };
  // Q, K, V, the mask and the model's output go to the GPU once, for the reference, every kernel
  // and every comparison.
  const SharedUploads uploads;
  const auto reference_start = Clock::now();
  ReferenceOutput reference = reference_for(call, options);
  // Observers read the reference on the host.
  if (options.on_kernel_output) host_values(reference);
  result.replay_seconds["reference"] = since(reference_start);
  double& prepare_s = result.replay_seconds["prepare"];
  double& measure_s = result.replay_seconds["measure"];
  double& judge_s = result.replay_seconds["judge"];
  double& compare_s = result.replay_seconds["compare"];
  // Compares with the reference, timed apart from the rest of judging (runs, downloads).
  auto compare = [&](const auto& output) {
    const auto start = Clock::now();
    ErrorStats error = compare_to_reference(output, reference);
    compare_s += since(start);
    return error;
  };
  result.reference_device = uses_gpu_reference(options) ? "cuda" : "cpu";
  result.reference_rows = static_cast<std::int64_t>(reference.rows.size());
  result.reference_sampled = reference.sampled;
  if (reference.fully_masked_rows > 0) {
    result.notes.push_back(fmt::format("{} (batch, head, row) triples have every key masked; the reference gives 0, and "
                                       "each kernel's errors are also given without them",
                                       reference.fully_masked_rows));
  }
  // Sampled rows depend on the seed. A generated call's flags already carry it (as its inputs'
  // seed, which a run also samples rows with), and a second --seed is a usage error.
  const std::string seed_flag =
      options.ref_sample_rows > 0 && call.source != "generated" ? fmt::format(" --seed {}", options.seed) : "";
  auto rerun_for = [&](const std::string& kernel) {
    return fmt::format("{} {} --kernels {}{}{}", options.rerun_command, rerun_input, kernel, options.rerun_base,
                       seed_flag);
  };

  const std::string group = options.timing_groups ? timing_key(call) : std::string();
  std::string shared_from;
  for (const Kernel* selected : select_kernels(options.kernels)) {
    // A kernel that does not take a ragged or paged batch as one runs it sequence by sequence.
    const PerSequenceKernel per_sequence(*selected);
    const KernelDescription& described = selected->description();
    const bool as_one = !call.is_ragged() || (call.is_paged() ? described.paged : described.ragged);
    const Kernel* kernel = as_one ? selected : &per_sequence;
    KernelResult k;
    k.kernel = kernel->name();
    if (options.progress) options.progress->kernel_started(k.kernel);
    k.source = KernelRegistry::instance().source_of(k.kernel);
    k.work = result.work;
    k.rerun = rerun_for(k.kernel);
    std::optional<std::string> unsupported;
    if (const auto missing = missing_extensions(kernel->description(), call); !missing.empty()) {
      unsupported = fmt::format("the call has {}, which this kernel does not compute", fmt::join(missing, " and "));
    }
    if (!unsupported) unsupported = kernel->unsupported_reason(call);
    if (!unsupported && kernel->description().is_reference && reference.sampled) {
      unsupported = "--ref-sample-rows is set, so the full reference is not run";
    }
    if (unsupported) {
      k.disposition = Disposition::not_supported;
      k.reason = *unsupported;
      result.kernels.push_back(std::move(k));
      continue;
    }
    try {
      auto stage = Clock::now();
      auto prepared = kernel->prepare(call);
      prepare_s += since(stage);
      stage = Clock::now();
      const bool on_gpu = kernel->description().device == "cuda";
      const StoppingRule& rule = on_gpu ? options.stopping_gpu : options.stopping;
      SampleTimer& timer = timer_for(kernel->description(), options);
      ClockMonitor* monitor = monitor_for(kernel->description());
      if (const SharedTiming* shared = options.timing_groups ? options.timing_groups->shared(group, k.kernel) : nullptr) {
        // One run gives the output this call is judged by; the time is its group's.
        prepared->run();
        prepared->synchronize();
        judge_s += since(stage);
        stage = Clock::now();
        k.timing = shared->timing;
        k.timing_with_preparation = shared->with_preparation;
        k.timing_of_preparation = shared->of_preparation;
        k.timing_shared_from = shared_from = shared->timed_call;
      } else {
        if (prepared->has_preparation()) {
          // The kernel and the whole call in turns, so that the two see the same clocks; the
          // preparation alone after them: in their turns its low power left the kernel's next turn
          // at a higher clock under a power cap (docs/metrics.md). Alone, it is its own figure: the
          // whole call's median less the kernel's is lost in their noise on long calls.
          PreparationRun with_preparation(*prepared, true), preparation_alone(*prepared, false);
          const TimedKernel pair[] = {{*prepared, {}}, {with_preparation, "timing with its input preparation"}};
          auto timings = measure_interleaved(pair, timer, rule, monitor);
          k.timing = std::move(timings[0]);
          k.timing_with_preparation = std::move(timings[1]);
          const TimedKernel alone[] = {{preparation_alone, "timing its input preparation alone"}};
          k.timing_of_preparation = std::move(measure_interleaved(alone, timer, rule, monitor).front());
        } else {
          k.timing = measure(*prepared, timer, rule, monitor);
        }
        if (options.timing_groups) options.timing_groups->record(group, k.kernel, {k.timing, k.timing_with_preparation, k.timing_of_preparation, call.where()});
        measure_s += since(stage);
        stage = Clock::now();
      }
      if (auto note = untimed_note(k)) result.notes.push_back(std::move(*note));
      if (const double bytes = prepared->preparation_bytes(); bytes > 0) {
        const double copy = options.ceilings.copy_gbps * 1e9;
        k.preparation = KernelResult::PreparationBound{bytes, copy > 0 ? bytes / copy : 0.0};
      }
      if (on_gpu && k.timing && !k.timing->untimed()) {
        const double matrix = options.ceilings.matrix_tflops_for(call.q.dtype);
        if (matrix > 0) k.matrix_ceiling_fraction = k.tflops() / matrix;
        if (options.ceilings.copy_gbps > 0) k.copy_ceiling_fraction = k.gbytes_per_s() / options.ceilings.copy_gbps;
      }
      // An output on the GPU is compared there; the host copy is made only for those who read it.
      auto* on_device = dynamic_cast<DeviceOutput*>(prepared.get());
      const bool host_output_read = options.on_kernel_output || !options.save_outputs_dir.empty();
      const HostTensor output = on_device && !host_output_read ? HostTensor{} : prepared->output();
      k.error = on_device ? compare(on_device->device_output()) : compare(output);
      judge(k, options, kernel->description().reduced_precision.value_or(call.q.dtype));
      if (!k.refcheck_failures.empty()) k.reason = fmt::format("{}", fmt::join(k.refcheck_failures, "; "));
      if (options.on_kernel_output) options.on_kernel_output(call, reference, k, output);
      if (!options.save_outputs_dir.empty()) {
        fs::create_directories(options.save_outputs_dir);
        const auto file = fs::path(options.save_outputs_dir) /
                          fmt::format("call{}_{}.pt", call.call_index, safe_file_part(k.kernel));
        write_pt_tensors({{"out", output}},
                         {{"kernel", k.kernel}, {"source", call.source}, {"call_index", std::to_string(call.call_index)}},
                         file.string());
      }
      judge_s += since(stage);
    } catch (const KernelNotSupported& declined) {
      k.disposition = Disposition::not_supported;
      k.reason = declined.what();
      k.timing.reset();
      k.error.reset();
    } catch (const c10::Error& error) {
      // libtorch's message; its C++ backtrace would flood the table, so it goes to the JSON only.
      k.disposition = Disposition::failed;
      k.reason = error.what_without_backtrace();
      k.detail = error.what();
      k.timing.reset();
      k.error.reset();
    } catch (const std::exception& error) {
      k.disposition = Disposition::failed;
      k.reason = error.what();
      if (const auto* failure = dynamic_cast<const KernelFailure*>(&error)) k.detail = failure->detail();
      k.timing.reset();
      k.error.reset();
    }
    result.kernels.push_back(std::move(k));
  }
  if (!shared_from.empty()) {
    result.notes.push_back(fmt::format("timings measured on {}, which has the same shape, dtypes, layout, strides, "
                                       "mask and causality (--time-every-call times each call)", shared_from));
  }
  if (call.out) {
    const auto stage = Clock::now();
    KernelResult model;
    model.kernel = "model-output";
    model.work = result.work;
    const at::Device device = reference.device_values ? reference.device_values->device() : at::Device(at::kCPU);
    model.error = compare(bhsd_view(device_copy(*call.out, device), call.layout));
    judge(model, options, call.q.dtype);
    if (options.on_kernel_output) options.on_kernel_output(call, reference, model, to_bhsd(*call.out, call.layout));
    model.reason = call.backend.empty() ? "the output the model got" : "the output the model got from " + call.backend;
    if (!model.refcheck_failures.empty()) model.reason += fmt::format(": {}", fmt::join(model.refcheck_failures, "; "));
    result.kernels.push_back(std::move(model));
    judge_s += since(stage);
  }
  return result;
}

std::vector<std::size_t> wanted_positions(CaptureSource& source, const std::function<bool(std::int64_t)>& wanted,
                                          std::vector<std::string>& errors) {
  std::vector<std::size_t> positions;
  for (std::size_t position = 0; position < source.size(); ++position) {
    try {
      if (!wanted || wanted(source.load(position, /*with_data=*/false).call_index)) positions.push_back(position);
    } catch (const InputError& error) {
      errors.push_back(error.what());
    }
  }
  return positions;
}

void replay_capture(CaptureSource& source, const std::function<bool(std::int64_t)>& wanted,
                    const ReplayOptions& options, Report& report,
                    const std::function<void(const CallResult&)>& on_call,
                    const std::function<void(const AttentionCall&)>& on_loaded) {
  for (const std::string& error : source.open_errors()) report.input_errors.push_back(error);
  const std::vector<std::size_t> positions = wanted_positions(source, wanted, report.input_errors);
  if (options.progress) options.progress->add_calls(static_cast<std::int64_t>(positions.size()));
  CallPrefetcher calls(source, positions, options.prefetch_bytes, read_ahead_memory(options));
  for (;;) {
    try {
      const auto wait_start = std::chrono::steady_clock::now();
      const std::optional<AttentionCall> call = calls.next();
      if (!call) break;
      const double read_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
      if (on_loaded) on_loaded(*call);
      CallResult result =
          replay_call(*call, options, fmt::format("{} --calls {}", shell_quote(source.path()), call->call_index));
      result.replay_seconds["read"] = read_s;
      if (options.progress) options.progress->call_finished();
      if (on_call) on_call(result);
      report.calls.push_back(std::move(result));
    } catch (const InputError& error) {
      report.input_errors.push_back(error.what());
    }
  }
}

}  // namespace attnreplay
