// replay_call in named phases: describe the call, refuse what it cannot honour, upload, compute
// the reference, then per kernel: check, prepare, time (or share its group's timing), judge; and
// the model's own output last.
#include "replay/run/replay_call.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <mutex>

#include "formats/errors.h"
#include "formats/mask_structure.h"
#include "formats/pt_format.h"
#include "kernels/device_output.h"
#include "kernels/kernel.h"
#include "kernels/per_sequence.h"
#include "kernels/torch_inputs.h"
#include "replay/judge/attention_work.h"
#include "formats/call_semantics.h"
#include "replay/judge/compare.h"
#include "replay/judge/error_stats.h"
#include "replay/measure/gpu.h"
#include "replay/measure/measure.h"
#include "replay/run/kernel_selection.h"
#include "replay/run/prefetch.h"
#include "replay/run/rerun.h"

namespace attnreplay {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

// Adds the wall time since it was made (or last lapped) to one of the call's replay_seconds.
class Stopwatch {
 public:
  explicit Stopwatch(CallResult& result) : result_(result) {}
  void lap(const char* phase) {
    const auto now = Clock::now();
    result_.replay_seconds[phase] += std::chrono::duration<double>(now - start_).count();
    start_ = now;
  }
  void restart() { start_ = Clock::now(); }

 private:
  CallResult& result_;
  Clock::time_point start_ = Clock::now();
};

// What one call's kernels share while they are replayed.
struct CallReplay {
  const AttentionCall& call;
  const ReplayOptions& options;
  const ReferenceOutput& reference;
  CallResult& result;
  std::string rerun_input;
  std::string timing_group;  // empty when no call shares a timing
  std::string shared_from;   // the call whose timings this one reused, if any
};

bool uses_gpu_reference(const ReplayOptions& options) {
  return options.reference_device == "cuda" || (options.reference_device == "auto" && gpu_reference_available());
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

// ---- The call ----

CallResult describe_call(const AttentionCall& call, const ReplayOptions& options) {
  CallResult result;
  result.source = call.source;
  result.call_index = call.call_index;
  result.op = call.op;
  result.backend = call.backend;
  result.shape = call.shape();
  result.dtype = std::string(dtype_name(call.q.dtype));
  result.layout = call.layout;
  result.is_causal = call.is_causal;
  result.causal_alignment = call.causal_alignment;
  result.mask = describe_mask(call.mask);
  for (const auto extension : call.extensions()) result.extensions.push_back(call.describe(extension));
  result.batching = call.describe_batch();
  if (call.is_ragged()) {
    for (const auto& sequence : call.sequences()) result.sequence_lengths.emplace_back(sequence.q_len, sequence.k_len);
  }
  result.scale = call.softmax_scale();
  result.metadata = call.metadata;
  result.case_tag = options.case_tag;
  result.work = attention_work(call);
  result.quant_options = options.kernel_options.quant;
  return result;
}

// An argument the replay cannot honour (a sliding window, a softcap, ...) would make every kernel
// be judged against the wrong answer: the call is refused, loudly, kernel by kernel. True when it is.
bool refuse_unreplayable(const AttentionCall& call, const ReplayOptions& options, CallResult& result) {
  const auto refused = unreplayable_arguments(call);
  if (refused.empty()) return false;
  const std::string reason =
      fmt::format("not replayed: the call has {}, which the replay cannot honour", fmt::join(refused, ", "));
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
  return true;
}

// The call as it is replayed: without dropout, which no kernel's output could be judged under.
AttentionCall replayable_call(const AttentionCall& captured, CallResult& result) {
  AttentionCall call = captured;
  if (call.dropout_p > 0) {
    result.notes.push_back(fmt::format("captured with dropout_p={}; replayed without dropout", call.dropout_p));
    call.dropout_p = 0;
  }
  return call;
}

ReferenceOutput compute_reference(const AttentionCall& call, const ReplayOptions& options, CallResult& result) {
  Stopwatch stopwatch(result);
  ReferenceOutput reference = reference_for(call, options);
  // Observers read the reference on the host.
  if (options.on_kernel_output) host_values(reference);
  stopwatch.lap("reference");
  result.reference_device = uses_gpu_reference(options) ? "cuda" : "cpu";
  result.reference_rows = static_cast<std::int64_t>(reference.rows.size());
  result.reference_sampled = reference.sampled;
  if (reference.fully_masked_rows > 0) {
    result.notes.push_back(fmt::format("{} (batch, head, row) triples have every key masked; the reference gives 0, and "
                                       "each kernel's errors are also given without them",
                                       reference.fully_masked_rows));
  }
  return reference;
}

// Compares with the reference, timed apart from the rest of judging (runs, downloads).
template <class Output>
ErrorStats compare(const Output& output, CallReplay& r) {
  Stopwatch stopwatch(r.result);
  ErrorStats error = compare_to_reference(output, r.reference);
  stopwatch.lap("compare");
  return error;
}

// ---- Each kernel ----

// A kernel that does not take a ragged or paged batch as one, or a padded batch's key ranges, runs
// it sequence by sequence.
struct KernelForCall {
  const Kernel& selected;
  PerSequenceKernel per_sequence{selected};
  const Kernel& of(const AttentionCall& call) const {
    return runs_per_sequence(selected.description(), call) ? per_sequence : selected;
  }
};

std::optional<std::string> check_support(const Kernel& kernel, const CallReplay& r) {
  if (auto reason = kernel_declines(kernel, r.call)) return reason;
  if (kernel.description().is_reference && r.reference.sampled) {
    return "--ref-sample-rows is set, so the full reference is not run";
  }
  return std::nullopt;
}

void measure_kernel(PreparedKernel& prepared, const KernelDescription& kernel, KernelResult& k, const CallReplay& r) {
  const bool on_gpu = kernel.device == "cuda";
  const StoppingRule& rule = on_gpu ? r.options.stopping_gpu : r.options.stopping;
  SampleTimer& timer = timer_for(kernel.device, r.options.timing, r.options.hot_l2);
  ClockMonitor* monitor = on_gpu ? gpu_clock_monitor() : nullptr;
  if (prepared.has_preparation()) {
    using Headline = KernelDescription::Headline;
    const bool whole_call = kernel.headline == Headline::whole_call;
    PreparedTimings timings =
        measure_with_preparation(prepared, timer, rule, monitor, r.options.time_preparation, whole_call);
    if (whole_call) {
      k.timing = std::move(timings.with_preparation);
      k.timing_kernel_alone = std::move(timings.kernel);
    } else {
      // run() alone: the kernel, or a library's call whose preparation is set-up done once.
      if (kernel.headline == Headline::kernel) k.timed = "kernel";
      k.timing = std::move(timings.kernel);
      k.timing_with_preparation = std::move(timings.with_preparation);
    }
    k.timing_of_preparation = std::move(timings.of_preparation);
  } else {
    k.timing = measure(prepared, timer, rule, monitor);
  }
}

// The kernel's timings: its group's where a call of the same timing key was timed (one run then
// gives the output this call is judged by), else measured here and recorded for the group.
void time_kernel(PreparedKernel& prepared, const KernelDescription& kernel, KernelResult& k, CallReplay& r) {
  Stopwatch stopwatch(r.result);
  TimingGroups* groups = r.options.timing_groups;
  if (const SharedTiming* shared = groups ? groups->shared(r.timing_group, k.kernel) : nullptr) {
    prepared.run();
    prepared.synchronize();
    stopwatch.lap("judge");
    k.timing = shared->timing;
    k.timed = shared->timed;
    k.timing_with_preparation = shared->with_preparation;
    k.timing_kernel_alone = shared->kernel_alone;
    k.timing_of_preparation = shared->of_preparation;
    k.timing_shared_from = r.shared_from = shared->timed_call;
  } else {
    measure_kernel(prepared, kernel, k, r);
    if (groups) {
      groups->record(r.timing_group, k.kernel,
                     {k.timing, k.timed, k.timing_with_preparation, k.timing_kernel_alone, k.timing_of_preparation,
                      r.call.where()});
    }
    stopwatch.lap("measure");
  }
  if (auto note = untimed_note(k)) r.result.notes.push_back(std::move(*note));
}

// Rates beside what bounds them: the preparation's bytes at the copy ceiling, the kernel's
// TFLOP/s and GB/s over the GPU's measured ceilings.
void place_against_ceilings(const PreparedKernel& prepared, const KernelDescription& kernel, KernelResult& k,
                            const CallReplay& r) {
  const Ceilings& ceilings = r.options.ceilings;
  if (const double bytes = prepared.preparation_bytes(); bytes > 0) {
    const double copy = ceilings.copy_gbps * 1e9;
    k.preparation = KernelResult::PreparationBound{bytes, copy > 0 ? bytes / copy : 0.0};
  }
  if (kernel.device == "cuda" && k.timing && !k.timing->untimed()) {
    const double matrix = ceilings.matrix_tflops_for(r.call.q.dtype);
    if (matrix > 0) k.matrix_ceiling_fraction = k.tflops() / matrix;
    if (ceilings.copy_gbps > 0) k.copy_ceiling_fraction = k.gbytes_per_s() / ceilings.copy_gbps;
  }
}

void save_output(const HostTensor& output, const KernelResult& k, const CallReplay& r) {
  fs::create_directories(r.options.save_outputs_dir);
  const auto file =
      fs::path(r.options.save_outputs_dir) / fmt::format("call{}_{}.pt", r.call.call_index, safe_file_part(k.kernel));
  write_pt_tensors({{"out", output}},
                   {{"kernel", k.kernel}, {"source", r.call.source}, {"call_index", std::to_string(r.call.call_index)}},
                   file.string());
}

// The kernel's output against the reference, and the verdict on it.
void judge_kernel(PreparedKernel& prepared, const KernelDescription& kernel, KernelResult& k, CallReplay& r) {
  Stopwatch stopwatch(r.result);
  // An output on the GPU is compared there; the host copy is made only for those who read it.
  auto* on_device = dynamic_cast<DeviceOutput*>(&prepared);
  const bool host_output_read = r.options.on_kernel_output || !r.options.save_outputs_dir.empty();
  const HostTensor output = on_device && !host_output_read ? HostTensor{} : prepared.output();
  k.error = on_device ? compare(on_device->device_output(), r) : compare(output, r);
  judge(k, r.options.refcheck, kernel.reduced_precision.value_or(r.call.q.dtype));
  if (!k.refcheck_failures.empty()) k.reason = fmt::format("{}", fmt::join(k.refcheck_failures, "; "));
  if (r.options.on_kernel_output) r.options.on_kernel_output(r.call, r.reference, k, output);
  if (!r.options.save_outputs_dir.empty()) save_output(output, k, r);
  stopwatch.lap("judge");
}

void record_failure(KernelResult& k, Disposition disposition, std::string reason, std::string detail = {}) {
  k.disposition = disposition;
  k.reason = std::move(reason);
  k.detail = std::move(detail);
  k.timing.reset();
  k.error.reset();
}

KernelResult replay_kernel(const Kernel& selected, CallReplay& r) {
  const KernelForCall chosen{selected};
  const Kernel& kernel = chosen.of(r.call);
  KernelResult k;
  k.kernel = kernel.name();
  if (r.options.progress) r.options.progress->kernel_started(k.kernel);
  k.source = KernelRegistry::instance().source_of(k.kernel);
  k.emulation = kernel.description().emulation;
  if (const auto reduced = kernel.description().reduced_precision) k.reduced_precision = std::string(dtype_name(*reduced));
  k.work = r.result.work;
  k.rerun = rerun_command(r.options, r.rerun_input, k.kernel, r.call);
  if (auto unsupported = check_support(kernel, r)) {
    k.disposition = Disposition::not_supported;
    k.reason = *unsupported;
    return k;
  }
  try {
    Stopwatch stopwatch(r.result);
    auto prepared = kernel.prepare(r.call, r.options.kernel_options);
    stopwatch.lap("prepare");
    if (const double compile_s = prepared->compile_seconds(); compile_s > 0) k.compile_s = compile_s;
    time_kernel(*prepared, kernel.description(), k, r);
    place_against_ceilings(*prepared, kernel.description(), k, r);
    judge_kernel(*prepared, kernel.description(), k, r);
  } catch (const KernelNotSupported& declined) {
    record_failure(k, Disposition::not_supported, declined.what());
  } catch (const c10::Error& error) {
    // libtorch's message; its C++ backtrace would flood the table, so it goes to the JSON only.
    record_failure(k, Disposition::failed, error.what_without_backtrace(), error.what());
  } catch (const std::exception& error) {
    const auto* failure = dynamic_cast<const KernelFailure*>(&error);
    record_failure(k, Disposition::failed, error.what(), failure ? failure->detail() : std::string());
  }
  return k;
}

// The output the model got, judged like a kernel's.
KernelResult judge_model_output(CallReplay& r) {
  Stopwatch stopwatch(r.result);
  KernelResult model;
  model.kernel = "model-output";
  model.work = r.result.work;
  const AttentionCall& call = r.call;
  const at::Device device = r.reference.device_values ? r.reference.device_values->device() : at::Device(at::kCPU);
  model.error = compare(bhsd_view(device_copy(*call.out, device), call.layout), r);
  judge(model, r.options.refcheck, call.q.dtype);
  if (r.options.on_kernel_output) r.options.on_kernel_output(call, r.reference, model, to_bhsd(*call.out, call.layout));
  model.reason = call.backend.empty() ? "the output the model got" : "the output the model got from " + call.backend;
  if (!model.refcheck_failures.empty()) model.reason += fmt::format(": {}", fmt::join(model.refcheck_failures, "; "));
  stopwatch.lap("judge");
  return model;
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
    // Kept on the GPU: kernels' outputs are compared there (replay/judge/error_stats.h).
    reference = reference_attention_gpu(call, rows, /*keep_on_device=*/true);
  }
  mark_rows_without_keys(call, reference);
  return reference;
}

// An untimed kernel's figures are NaN, shown as "-" and null. stderr says so once a process too,
// since a table may not be printed.
std::optional<std::string> untimed_note(const KernelResult& k) {
  std::vector<std::string> untimed;
  const TimingSummary* first = nullptr;
  const std::pair<const std::optional<TimingSummary>*, const char*> timings[] = {
      {&k.timing, k.timed == "kernel" ? "alone" : "the whole call"}, {&k.timing_with_preparation, "with its input preparation"},
      {&k.timing_kernel_alone, "the kernel alone"},
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

struct CallInReplay::State {
  const ReplayOptions& options;
  std::string rerun_input;
  CallResult result;
  bool refused = false;
  AttentionCall call;  // as replayed: the captured call without dropout
  std::optional<ReferenceOutput> reference;
  std::vector<const Kernel*> kernels;
  std::vector<std::optional<KernelResult>> done;  // per kernel, in --kernels' order
  bool model_output_judged = false;
  std::string timing_group, shared_from;

  State(const ReplayOptions& o, std::string rerun) : options(o), rerun_input(std::move(rerun)) {}

  // Each within one SharedUploads scope of the caller's: Q, K, V, the mask and the model's output
  // go to the GPU once for the reference and the kernels replayed together.
  void compute_reference_once() {
    if (reference) return;
    reference = compute_reference(call, options, result);
    for (const char* phase : {"prepare", "measure", "judge", "compare"}) result.replay_seconds[phase] = 0;
  }
  void replay(std::size_t i) {
    CallReplay replay{call, options, *reference, result, rerun_input, timing_group, shared_from};
    done[i] = replay_kernel(*kernels[i], replay);
    shared_from = replay.shared_from;
  }
  // Once every kernel has run: the results in --kernels' order, then the model's output.
  void complete() {
    for (auto& kernel : done) result.kernels.push_back(std::move(*kernel));
    if (!shared_from.empty()) {
      result.notes.push_back(fmt::format("timings measured on {}, which has the same shape, dtypes, layout, strides, "
                                         "mask and causality (--time-every-call times each call)", shared_from));
    }
    if (call.out) {
      CallReplay replay{call, options, *reference, result, rerun_input, timing_group, shared_from};
      result.kernels.push_back(judge_model_output(replay));
    }
    model_output_judged = true;
  }
};

CallInReplay::CallInReplay(const AttentionCall& captured, const ReplayOptions& options, std::string rerun_input)
    : state_(std::make_unique<State>(options, std::move(rerun_input))) {
  State& s = *state_;
  // Which keys its rows see, read once here for the work counted and every kernel that takes a mask
  // as structure (a ragged call's sequences are read one by one where a kernel takes them so).
  AttentionCall read = captured;
  if (!read.is_ragged()) read.visibility = std::make_shared<const CallVisibility>(read_call_visibility(read));
  s.result = describe_call(read, options);
  s.refused = refuse_unreplayable(read, options, s.result);
  if (s.refused) return;
  s.call = replayable_call(read, s.result);
  if (s.call.visibility) s.result.mask_structure = s.call.visibility->mask_found;
  s.kernels = select_kernels(options.kernels);
  s.done.resize(s.kernels.size());
  if (options.timing_groups) s.timing_group = timing_key(s.call);
}

CallInReplay::~CallInReplay() = default;

bool CallInReplay::replay_ready_kernels() {
  State& s = *state_;
  if (s.refused || s.model_output_judged) return true;
  const SharedUploads uploads;
  s.compute_reference_once();
  bool left = false;
  for (std::size_t i = 0; i < s.kernels.size(); ++i) {
    if (s.done[i]) continue;
    if (s.kernels[i]->ready()) s.replay(i);
    else left = true;
  }
  if (!left) s.complete();
  return !left;
}

CallResult CallInReplay::finish() {
  State& s = *state_;
  if (!s.refused && !s.model_output_judged) {
    const SharedUploads uploads;
    s.compute_reference_once();
    for (std::size_t i = 0; i < s.kernels.size(); ++i) {
      if (s.done[i]) continue;
      s.kernels[i]->wait_until_ready();
      s.replay(i);
    }
    s.complete();
  }
  return std::move(s.result);
}

std::uint64_t CallInReplay::bytes_held() const {
  const State& s = *state_;
  std::uint64_t bytes = s.refused ? 0 : call_bytes(s.call);
  if (s.reference) {
    bytes += s.reference->values.size() * sizeof(double);
    if (s.reference->device_values) bytes += static_cast<std::uint64_t>(s.reference->device_values->nbytes());
  }
  return bytes;
}

CallResult replay_call(const AttentionCall& call, const ReplayOptions& options, const std::string& rerun_input) {
  return CallInReplay(call, options, rerun_input).finish();
}

}  // namespace attnreplay
