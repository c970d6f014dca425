// libattncap_torch.so: records every attention call. Loaded by libattncap.so once libtorch is in
// the process. This file holds the process's capture (its start, output, exit and forks) and the
// ops' observation: which ops are calls, which calls are recorded, and their begin and end; a
// call's record, its substitution and Python entry points' calls have files of their own
// (observation.h lists them).
//
// Ops the dispatcher knows at start (torch's SDPA and its backends) are observed by hooks put in
// front of their own kernels (op_hooks.h), which cost nothing to any other op. Ops registered
// later (flash-attn, SageAttention, xformers register theirs on import) are observed by a global
// RecordFunction callback, added only once such an op appears. Either way, inputs are copied
// before the op runs and the output after it. Our own copies run with observers off on this
// thread, so they are never observed. Under ATTNCAP_SUBSTITUTE an op's attention output may come from
// an attnreplay kernel instead of its own (substituter.h). Nothing here throws into the job.
#include <ATen/ATen.h>
#include <ATen/SequenceNumber.h>
#include <ATen/core/function_schema.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <torch/library.h>
#include <torch/version.h>
#include <fmt/ranges.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <unordered_map>

#include "capture/host_copy.h"
#include "capture/observation.h"
#include "capture/op_hooks.h"
#include "capture/python_entry_points.h"

extern char** environ;

namespace attnreplay::capture {

State* state = nullptr;

void count_failed() {
  if (state->recorder) ++state->recorder->stats().failed;
}

void report_failure_once(const std::exception& error) {
  static std::once_flag reported;
  std::call_once(reported, [&] {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
    std::fprintf(stderr, "[attncap] a call was not captured: %s\n",
                 c10_error ? c10_error->what_without_backtrace() : error.what());
  });
}

bool op_wanted(const std::string& name) {
  if (name.rfind("attncap::", 0) == 0 || !std::regex_search(name, state->ops)) return false;
  return state->config.backward || name.find("backward") == std::string::npos;
}

namespace {
namespace fs = std::filesystem;

// Matched ops active on this thread: the outermost one is recorded, inner ones name its backend.
thread_local int active_depth = 0;
// Attention calls seen on this thread: tells whether nn.MultiheadAttention's fast path made one.
thread_local std::int64_t attention_calls_on_thread = 0;
thread_local PendingCall* outermost = nullptr;

// For the RecordFunction callback: matched ops that no hook observes.
bool op_matches(const char* name) {
  // Op names are static strings: cache the verdict per pointer, per thread (no locking).
  thread_local std::unordered_map<const char*, bool> verdicts;
  auto found = verdicts.find(name);
  if (found != verdicts.end()) return found->second;
  const bool match = op_wanted(name) && !state->hooked.count(name);
  verdicts.emplace(name, match);
  return match;
}

void shutdown_at_exit();

constexpr const char* kMultiheadFastPath = "aten::_native_multi_head_attention";

// nn.MultiheadAttention's fast path: on some devices it computes attention inside the one op
// (bmm, softmax, bmm) and calls no attention op that could be captured. Say so once.
struct MultiheadMarker final : at::ObserverContext {
  std::int64_t calls_before = attention_calls_on_thread;
};

std::unique_ptr<at::ObserverContext> begin_multihead(const std::string&, const c10::FunctionSchema&,
                                                     c10::ArrayRef<c10::IValue>) {
  return std::make_unique<MultiheadMarker>();
}

void end_multihead(at::ObserverContext* context, const c10::ArrayRef<c10::IValue>*) {
  const auto* marker = static_cast<MultiheadMarker*>(context);
  if (attention_calls_on_thread == marker->calls_before && !state->config.quiet) {
    static std::once_flag said;
    std::call_once(said, [] {
      std::fprintf(stderr, "[attncap] nn.MultiheadAttention's fast path (%s) computed attention inside one op, "
                           "with no attention op to capture: those calls are not in the capture\n", kMultiheadFastPath);
    });
  }
}

void say_graph_capture_once(const std::string& op) {
  static std::once_flag said;
  std::call_once(said, [&] {
    if (!state->config.quiet) {
      std::fprintf(stderr, "[attncap] %s ran while a CUDA graph was being captured: calls inside CUDA graphs are "
                           "not recorded (their replays bypass the dispatcher)\n", op.c_str());
    }
  });
}

}  // namespace

void flush_before_cuda_exits(const at::Tensor& tensor) {
  static std::once_flag registered;
  std::call_once(registered, [&] {
    HostCopy::prepare_device(tensor);
    std::atexit(shutdown_at_exit);
  });
}

std::optional<CallPlace> place_call() {
  if (!state->config.call_site) return std::nullopt;
  CallPlace place{current_call_site(), {}};
  std::lock_guard lock(state->position_mutex);
  place.position = state->positions->next(place.site.caller_id);
  return place;
}

Selection select_call() {
  const std::int64_t index = state->next_index++;
  if (!state->recorder) return {index, false};
  ++state->recorder->stats().seen;
  const bool wanted = state->recorder->accepting() && state->config.selects(index) &&
                      (state->config.max_calls < 0 || state->selected.load() < state->config.max_calls);
  if (wanted) {
    ++state->selected;
  } else if (state->config.max_calls >= 0 && state->selected.load() >= state->config.max_calls &&
             state->config.selects(index)) {
    ++state->recorder->stats().dropped_budget;
  }
  return {index, wanted};
}

std::unique_ptr<at::ObserverContext> begin_call(const std::string& op, const c10::FunctionSchema* schema,
                                                c10::ArrayRef<c10::IValue> inputs, std::int64_t sequence_nr,
                                                bool hooked, std::optional<Selection> preselected) {
  if (active_depth > 0) {
    ++active_depth;
    if (outermost && outermost->call.backend.empty()) outermost->call.backend = op;
    return std::make_unique<PassThrough>();
  }
  ++active_depth;
  try {
    for (const c10::IValue& input : inputs) {
      if (input.isTensor() && is_placeholder(input.toTensor())) return std::make_unique<PassThrough>();
    }
    ++attention_calls_on_thread;
    const auto first = std::find_if(inputs.begin(), inputs.end(), [](const c10::IValue& input) { return input.isTensor(); });
    if (first != inputs.end() && HostCopy::device_is_capturing_graph(first->toTensor())) {
      say_graph_capture_once(op);
      return std::make_unique<PassThrough>();
    }
    auto pending = std::make_unique<PendingCall>();
    const Selection selection = preselected ? *preselected : select_call();
    const std::optional<CallPlace> place =
        selection.wanted || state->substituter ? place_call() : std::nullopt;
    // The arguments by name, looked up once for the substitution and the record.
    const CallArguments arguments =
        selection.wanted || state->substituter ? call_arguments(schema, inputs) : CallArguments{};
    if (state->substituter) judge_substitution(*pending, op, schema, hooked, arguments, selection.index, place);
    if (selection.wanted || pending->substitute) {
      at::RecordFunctionGuard no_observers(false);  // our copies must not be observed
      c10::AutoGradMode no_grad(false);
      pending->record = selection.wanted;
      fill_call(*pending, op, schema, arguments, sequence_nr, selection.index, place);
    }
    if (state->clock && first != inputs.end()) {
      if (first->toTensor().is_cuda()) flush_before_cuda_exits(first->toTensor());
      pending->timing = state->clock->start(first->toTensor());
    }
    pending->started = std::chrono::steady_clock::now();
    outermost = pending.get();
    return pending;
  } catch (const std::exception& error) {
    count_failed();
    report_failure_once(error);
    return std::make_unique<PassThrough>();
  }
}

void end_call(at::ObserverContext* context, const c10::ArrayRef<c10::IValue>* outputs) {
  if (!context) return;
  auto* pending = dynamic_cast<PendingCall*>(context);
  // Before the depth drops: attention ops the kernel itself calls are inner ones, never calls.
  if (pending && pending->substitute && pending->after_the_op && outputs) substitute_after_the_op(*pending, *outputs);
  --active_depth;
  if (!pending) return;
  if (outermost == pending) outermost = nullptr;
  // A call computed through the host copies ran synchronously: its wall time is its time. Any other
  // GPU call was only queued.
  const bool through_host = pending->substituted && !pending->resident;
  if (pending->timing && outputs) state->clock->stop(*pending->timing, /*wall=*/through_host);
  if (state->substituter && outputs) {
    state->substituter->count(pending->substituted, pending->resident.has_value(), pending->left_reason,
                              std::chrono::duration<double>(std::chrono::steady_clock::now() - pending->started).count(),
                              pending->on_gpu && !through_host);
    if (pending->substituted) {
      pending->call.metadata["substituted_by"] = state->substituter->kernel_name();
    } else {
      pending->call.metadata["substitution_left"] = pending->left_reason;
    }
  }
  if (!pending->record || !outputs) return;
  try {
    at::RecordFunctionGuard no_observers(false);
    c10::AutoGradMode no_grad(false);
    if (state->config.record_output) {
      const at::Tensor* out = pending->python_output ? &*pending->python_output : attention_output(*outputs);
      if (out) pending->copies->out = HostCopy::start(*out);
    }
    if (pending->call.backend.empty()) pending->call.backend = pending->call.op;
    pending->call.metadata["duration_s"] = fmt::format(
        "{:.9f}", std::chrono::duration<double>(std::chrono::steady_clock::now() - pending->started).count());
    const std::uint64_t bytes = pending->copies->nbytes();
    state->recorder->submit(std::move(pending->call), bytes,
                            [copies = pending->copies](AttentionCall& call) { copies->finish_into(call); });
  } catch (const std::exception& error) {
    count_failed();
    report_failure_once(error);
  }
}

namespace {

std::unique_ptr<at::ObserverContext> begin_hooked(const std::string& op, const c10::FunctionSchema& schema,
                                                  c10::ArrayRef<c10::IValue> inputs) {
  return begin_call(op, &schema, inputs, static_cast<std::int64_t>(at::sequence_number::peek()), /*hooked=*/true);
}

// RecordFunction callbacks, for matched ops that were registered after capture started.
std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (!state || !op_matches(fn.name())) return nullptr;
  const auto schema = fn.operator_schema();
  return begin_call(fn.name(), schema ? &*schema : nullptr, fn.inputs(), fn.seqNr(), /*hooked=*/false);
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* context) {
  if (!context) return;
  const auto& outputs = fn.outputs();
  const c10::ArrayRef<c10::IValue> view(outputs);
  end_call(context, &view);
}

// Observes every matched op that no hook sees through one global RecordFunction callback (once).
// Returns false when it was on already.
bool observe_through_record_function() {
  if (state->record_function_on.exchange(true)) return false;
  at::addGlobalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                            .needsInputs(true)
                            .needsOutputs(true)
                            .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  return true;
}

// An op registered after start that capture wants: only RecordFunction can see it.
void on_new_op(const std::string& name) {
  if (!op_wanted(name) || state->hooked.count(name) || !observe_through_record_function()) return;
  if (!state->config.quiet) {
    std::fprintf(stderr, "[attncap] %s was registered after capture started: observing it through RecordFunction, "
                         "which costs every op of the job a little\n", name.c_str());
  }
}

void install_observers() {
  if (!op_hooks_supported()) {
    // torch before 2.9: no per-op hooks, so RecordFunction sees every matched op from the start.
    observe_through_record_function();
    if (!state->config.quiet) {
      std::fprintf(stderr, "[attncap] torch %s has no per-op hooks: observing attention ops through RecordFunction, "
                           "which costs every op of the job a little (torch 2.9 and later: nothing)\n", TORCH_VERSION);
    }
    return;
  }
  const HookCallbacks calls{&begin_hooked, &end_call, state->substituter ? &substitute_hooked : nullptr};
  for (const HookedOp& hooked : install_op_hooks(op_wanted, calls)) {
    state->hooked.insert(hooked.op);
  }
  install_op_hooks([](const std::string& name) { return name == kMultiheadFastPath; }, {&begin_multihead, &end_multihead});
  watch_new_ops(on_new_op);
}

std::vector<std::string> attncap_variable_names() {
  std::vector<std::string> names;
  for (char** entry = environ; entry && *entry; ++entry) {
    std::string text(*entry);
    if (text.rfind("ATTNCAP_", 0) == 0) names.push_back(text.substr(0, text.find('=')));
  }
  return names;
}

std::string launcher_rank() {
  for (const char* name : {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}) {
    if (const char* value = std::getenv(name)) return value;
  }
  return {};
}

// One file per process, named so that processes never collide: host, pid, start time, rank.
std::string output_path(const CaptureConfig& config, const std::string& rank) {
  const fs::path out(config.out);
  const std::string extension = config.format == OutputFormat::hdf5 ? ".h5" : "";
  if (config.format == OutputFormat::hdf5 && out.extension() == ".h5") {
    fs::create_directories(out.has_parent_path() ? out.parent_path() : fs::path("."));
    if (!fs::exists(out)) return out.string();
    return (out.parent_path() / fmt::format("{}-{}.h5", out.stem().string(), getpid())).string();
  }
  fs::create_directories(out);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &utc);
  return (out / fmt::format("attncap-{}-{}-{}{}{}", host, getpid(), stamp, rank.empty() ? "" : "-rank" + rank,
                            extension))
      .string();
}

void shutdown_at_exit() {
  if (state && state->recorder) state->recorder->shutdown();
  // Said once, at the first call: the last registered, before CUDA tears down.
  static std::once_flag reported;
  std::call_once(reported, [] {
    if (!state || state->config.quiet) return;
    if (state->substituter) state->substituter->report();
    if (state->clock) state->clock->report();
  });
}

void in_forked_child() {
  if (!state || !state->recorder) return;
  state->recorder->abandon_in_child();
  if (!state->config.quiet) {
    std::fprintf(stderr, "[attncap] capture is off in forked child %d (the parent's capture goes on)\n", getpid());
  }
}

}  // namespace
}  // namespace attnreplay::capture

extern "C" __attribute__((visibility("default"))) void attncap_start() {
  using namespace attnreplay::capture;
  if (state) return;
  try {
    auto parsed = parse_config([](const char* name) { return std::getenv(name); }, attncap_variable_names());
    if (auto* error = std::get_if<std::string>(&parsed)) {
      std::fprintf(stderr, "[attncap] capture is off: %s\n", error->c_str());
      return;
    }
    auto fresh = std::make_unique<State>();
    fresh->config = std::get<CaptureConfig>(parsed);
    fresh->ops = std::regex(fresh->config.ops_pattern);
    fresh->rank = launcher_rank();
    fresh->positions = std::make_unique<PositionTracker>(fresh->config.calls_per_step);
    if (!fresh->config.substitute.empty()) {
      fresh->substituter = Substituter::open(fresh->config);
      if (!fresh->substituter && !fresh->config.capture && !fresh->config.time_attention) return;
    }
    if (fresh->config.time_attention) fresh->clock = std::make_unique<AttentionClock>();
    std::string path;
    if (fresh->config.capture) {
      path = output_path(fresh->config, fresh->rank);
      // Opening the output initialises HDF5, which registers its own exit handler; ours is
      // registered after it so that it runs first and closes the file while HDF5 still works.
      fresh->recorder = std::make_unique<Recorder>(fresh->config, path);
    }
    state = fresh.release();
    std::atexit(shutdown_at_exit);
    pthread_atfork(nullptr, nullptr, in_forked_child);
    install_observers();
    // Python entry points are observed for capture, and for substitution, which overwrites their output.
    if (state->config.capture || state->substituter) install_python_entry_points(state->config.quiet, define_python_call_ops);
    if (!state->config.capture) return;
    if (!state->config.quiet) std::fprintf(stderr, "[attncap] capturing attention calls to %s\n", path.c_str());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "[attncap] capture is off: %s\n", error.what());
  }
}
