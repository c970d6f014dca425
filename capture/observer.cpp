// libattncap_torch.so: records every attention call. Loaded by libattncap.so once libtorch is in
// the process.
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

#include "capture/attention_clock.h"
#include "capture/call_site.h"
#include "capture/config.h"
#include "capture/host_copy.h"
#include "capture/op_hooks.h"
#include "capture/python_entry_points.h"
#include "capture/ragged_map.h"
#include "capture/recorder.h"
#include "capture/substituter.h"
#include "formats/torch_tensor.h"

extern char** environ;

namespace attnreplay::capture {
namespace {
namespace fs = std::filesystem;

struct State {
  CaptureConfig config;
  std::regex ops;
  std::unique_ptr<Recorder> recorder;        // null when nothing is written (substitution alone)
  std::unique_ptr<Substituter> substituter;  // null unless ATTNCAP_SUBSTITUTE
  std::unique_ptr<AttentionClock> clock;     // null unless ATTNCAP_TIME_ATTENTION
  std::atomic<std::int64_t> next_index{0};
  std::atomic<std::int64_t> selected{0};
  std::mutex position_mutex;
  std::unique_ptr<PositionTracker> positions;
  std::string rank;
  std::set<std::string> hooked;              // op names observed by hooks, never by RecordFunction
  std::atomic<bool> record_function_on{false};  // set once an op needing RecordFunction appears
};

State* state = nullptr;  // set once by attncap_start; never freed (callbacks may run at exit)

void count_failed() {
  if (state->recorder) ++state->recorder->stats().failed;
}

// Matched ops active on this thread: the outermost one is recorded, inner ones name its backend.
thread_local int active_depth = 0;
// Attention calls seen on this thread: tells whether nn.MultiheadAttention's fast path made one.
thread_local std::int64_t attention_calls_on_thread = 0;
thread_local struct PendingCall* outermost = nullptr;

// Host copies under way for one call; the writer thread finishes them into the record.
struct TensorCopies {
  std::optional<HostCopy> q, k, v, mask, out, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table;
  // A ragged call's copies are as ragged_map.h plans them (seqused_k and block_table holding the
  // call's own), made into the record's fields when finished.
  std::optional<RaggedLayout> ragged;
  std::optional<HostCopy> page_starts, last_page_lengths;
  // A dense (b, s, h, d) query of a paged or length-limited call is stored as its (b * s, h, d)
  // rows, and so is the output.
  bool flatten_batch = false;
  std::uint64_t finished_bytes = 0;  // copies finished early (a substituted call's inputs)
  std::uint64_t nbytes() const {
    std::uint64_t total = finished_bytes;
    for (const auto* copy : {&q, &k, &v, &mask, &out, &alibi_slopes, &sinks, &cu_seqlens_q, &cu_seqlens_k, &seqused_k,
                             &block_table, &page_starts, &last_page_lengths}) {
      total += *copy ? (*copy)->nbytes() : 0;
    }
    return total;
  }
  // Finishes the copies still pending into `call`; a second call finishes only those started since.
  void finish_into(AttentionCall& call) {
    auto finish = [this](std::optional<HostCopy>& copy, auto& field) {
      if (!copy) return;
      finished_bytes += copy->nbytes();
      field = copy->finish();
      copy.reset();
    };
    if (ragged) finish_ragged_into(call);
    finish(q, call.q);
    finish(k, call.k);
    finish(v, call.v);
    finish(mask, call.mask);
    finish(out, call.out);
    finish(alibi_slopes, call.alibi_slopes);
    finish(sinks, call.sinks);
    finish(cu_seqlens_q, call.cu_seqlens_q);
    finish(cu_seqlens_k, call.cu_seqlens_k);
    finish(seqused_k, call.seqused_k);
    finish(block_table, call.block_table);
    if (flatten_batch) {
      for (HostTensor* rows : {&call.q, call.out ? &*call.out : nullptr}) {
        if (!rows || rows->rank() != 4) continue;
        rows->shape = {rows->shape[0] * rows->shape[1], rows->shape[2], rows->shape[3]};
        rows->captured_strides.clear();
      }
    }
  }

 private:
  // The record's thd fields from the ragged call's copies, here, off the job's thread.
  void finish_ragged_into(AttentionCall& call) {
    RaggedHostCopies host;
    auto take = [this](std::optional<HostCopy>& copy) {
      std::optional<HostTensor> finished;
      if (copy) finished_bytes += copy->nbytes(), finished = copy->finish(), copy.reset();
      return finished;
    };
    host.q = *take(q), host.k = *take(k), host.v = *take(v);
    host.cu_seqlens_q = take(cu_seqlens_q), host.cu_seqlens_k = take(cu_seqlens_k), host.used = take(seqused_k);
    host.table = take(block_table), host.page_starts = take(page_starts);
    host.last_page_lengths = take(last_page_lengths);
    RaggedFields fields = ragged_fields(*ragged, std::move(host));
    ragged.reset();
    call.q = std::move(fields.q), call.k = std::move(fields.k), call.v = std::move(fields.v);
    call.cu_seqlens_q = std::move(fields.cu_seqlens_q), call.cu_seqlens_k = std::move(fields.cu_seqlens_k);
    call.seqused_k = std::move(fields.seqused_k), call.block_table = std::move(fields.block_table);
  }
};

struct PendingCall final : at::ObserverContext {
  bool record = false;
  AttentionCall call;  // everything but the tensor data
  std::shared_ptr<TensorCopies> copies = std::make_shared<TensorCopies>();
  std::chrono::steady_clock::time_point started;
  // Under ATTNCAP_SUBSTITUTE: whether the kernel is to be asked, whether it gave the output, and
  // otherwise why the call was left to the op. `after_the_op`: the op runs and its attention
  // output is then overwritten in place (an op that returns more, or one no hook stands before).
  bool substitute = false, after_the_op = false, substituted = false, on_gpu = false;
  std::string left_reason;
  // A dense call the kernel computes on the op's own tensors (Substituter::takes_resident): these,
  // as the op got them. None goes to the host unless the call is recorded.
  struct Resident {
    at::Tensor q, k, v;
    std::optional<at::Tensor> mask;
  };
  bool resident_wanted = false;  // the kernel takes the query's device; set before fill_call
  std::optional<Resident> resident;
  std::optional<at::Tensor> python_output;  // a Python entry point's output, which it has returned
  std::shared_ptr<AttentionClock::Started> timing;  // under ATTNCAP_TIME_ATTENTION
};

// Marks an inner or ignored matched op, so the end callback keeps the depth right.
struct PassThrough final : at::ObserverContext {};

// The op through which capture's Python side (python_entry_points.py) hands over calls of Python
// entry points; its kernel records them. Never matched by name: the call's own name is.
constexpr const char* kPythonCall = "attncap::python_call";

bool op_wanted(const std::string& name) {
  if (name.rfind("attncap::", 0) == 0 || !std::regex_search(name, state->ops)) return false;
  return state->config.backward || name.find("backward") == std::string::npos;
}

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

// Tensors that are not real data: compile-time fake tensors, meta tensors, functional wrappers.
bool is_placeholder(const at::Tensor& tensor) {
  if (!tensor.defined()) return false;
  if (tensor.is_meta() || !tensor.has_storage()) return true;
  const auto keys = tensor.key_set();
  return keys.has(c10::DispatchKey::Python) || keys.has(c10::DispatchKey::Functionalize);
}

struct NamedInput {
  std::string name;
  const c10::IValue* value;
};

std::vector<NamedInput> named_inputs(const c10::FunctionSchema* schema, c10::ArrayRef<c10::IValue> inputs) {
  std::vector<NamedInput> named;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    std::string name = schema && i < schema->arguments().size() ? schema->arguments()[i].name() : fmt::format("arg{}", i);
    named.push_back({std::move(name), &inputs[i]});
  }
  return named;
}

const c10::IValue* find_input(const std::vector<NamedInput>& inputs, std::initializer_list<const char*> names) {
  for (const char* wanted : names)
    for (const auto& input : inputs)
      if (input.name == wanted) return input.value;
  return nullptr;
}

// The KV-cache form (vLLM's _vllm_fa2_C::fwd_kvcache): the keys are `kcache`, and `k` and `v` are
// keys and values it appends to the cache before attending.
bool kv_cache_form(const std::vector<NamedInput>& inputs) {
  return find_input(inputs, {"kcache"}) && find_input(inputs, {"vcache"});
}

// Q, K, V by name, or the first three tensors for ops that name them otherwise.
std::array<const c10::IValue*, 3> find_qkv(const std::vector<NamedInput>& inputs) {
  std::array<const c10::IValue*, 3> qkv =
      kv_cache_form(inputs)
          ? std::array{find_input(inputs, {"q"}), find_input(inputs, {"kcache"}), find_input(inputs, {"vcache"})}
          : std::array{find_input(inputs, {"query", "q"}), find_input(inputs, {"key", "k"}),
                       find_input(inputs, {"value", "v"})};
  if (qkv[0] && qkv[1] && qkv[2]) return qkv;
  std::size_t found = 0;
  for (const auto& input : inputs) {
    if (input.value->isTensor() && found < 3) qkv[found++] = input.value;
  }
  return found == 3 ? qkv : std::array<const c10::IValue*, 3>{};
}

std::string scalar_text(const c10::IValue& value) {
  if (value.isNone()) return "None";
  if (value.isBool()) return value.toBool() ? "True" : "False";
  if (value.isInt()) return std::to_string(value.toInt());
  if (value.isDouble()) return fmt::format("{}", value.toDouble());
  if (value.isString()) return value.toStringRef();
  if (value.isIntList()) return fmt::format("{}", fmt::join(value.toIntVector(), ","));
  return {};
}

std::string thread_label() {
  return std::to_string(static_cast<long long>(gettid()));
}

void shutdown_at_exit();

// Exit handlers run in reverse order of registration, and CUDA (like every lazily made static)
// registers its teardown when it starts. Preparing the copy machinery, then registering our flush
// again once a GPU call is seen, makes the flush run first, while pending copies can complete.
void flush_before_cuda_exits(const at::Tensor& tensor) {
  static std::once_flag registered;
  std::call_once(registered, [&] {
    HostCopy::prepare_device(tensor);
    std::atexit(shutdown_at_exit);
  });
}

const at::Tensor* defined_tensor(const c10::IValue* value) {
  return value && value->isTensor() && value->toTensor().defined() ? &value->toTensor() : nullptr;
}

// Ragged and paged batches (flash-attn's varlen ops, FlashAttention-3's, vLLM's, FlashInfer's):
// their copies as ragged_map.h plans them, reading no value on the job's thread; the writer makes
// the record's thd form of them. Returns false, mapping nothing, for a call that is dense or in a
// form not recognised (its arguments are then kept, and refused).
bool map_ragged(const std::vector<NamedInput>& inputs, const std::array<const c10::IValue*, 3>& qkv,
                AttentionCall& call, TensorCopies& copies, std::set<std::string>& mapped) {
  const char* used_name = find_input(inputs, {"seqused_k"})   ? "seqused_k"
                          : find_input(inputs, {"seqlens_k"}) ? "seqlens_k"
                                                              : "cache_seqlens";
  const char* table_name = find_input(inputs, {"block_table"}) ? "block_table" : "page_table";
  RaggedArguments arguments;
  arguments.q = &qkv[0]->toTensor(), arguments.k = &qkv[1]->toTensor(), arguments.v = &qkv[2]->toTensor();
  arguments.cu_seqlens_q = defined_tensor(find_input(inputs, {"cu_seqlens_q"}));
  arguments.cu_seqlens_k = defined_tensor(find_input(inputs, {"cu_seqlens_k"}));
  arguments.used = defined_tensor(find_input(inputs, {used_name}));
  arguments.table = defined_tensor(find_input(inputs, {table_name}));
  arguments.page_starts = defined_tensor(find_input(inputs, {"paged_kv_indptr"}));
  arguments.page_indices = defined_tensor(find_input(inputs, {"paged_kv_indices"}));
  arguments.last_page_lengths = defined_tensor(find_input(inputs, {"paged_kv_last_page_len"}));
  const std::optional<RaggedCopies> planned = plan_ragged_copies(arguments);
  if (!planned) return false;
  auto start = [](const at::Tensor& tensor, std::optional<HostCopy>& copy) {
    if (tensor.defined()) copy = HostCopy::start(tensor);
  };
  start(planned->q, copies.q);
  start(planned->k, copies.k);
  start(planned->v, copies.v);
  start(planned->cu_seqlens_q, copies.cu_seqlens_q);
  start(planned->cu_seqlens_k, copies.cu_seqlens_k);
  start(planned->used, copies.seqused_k);
  start(planned->table, copies.block_table);
  start(planned->page_starts, copies.page_starts);
  start(planned->last_page_lengths, copies.last_page_lengths);
  copies.ragged = planned->layout;
  // A dense query's output is stored as its rows, as the query is.
  copies.flatten_batch = planned->layout.dense_query;
  call.layout = Layout::thd;
  // Every varlen and paged op of flash-attn's family aligns causality bottom-right.
  call.causal_alignment = CausalAlignment::bottom_right;
  for (const char* name : {"cu_seqlens_q", "cu_seqlens_k", used_name, table_name, "paged_kv_indptr", "paged_kv_indices",
                           "paged_kv_last_page_len"}) {
    mapped.insert(name);
  }
  return true;
}

// Where a call came from and its place in the run (layer, step), where call sites are on.
struct CallPlace {
  CallSite site;
  PositionTracker::Position position;
};

std::optional<CallPlace> place_call() {
  if (!state->config.call_site) return std::nullopt;
  CallPlace place{current_call_site(), {}};
  std::lock_guard lock(state->position_mutex);
  place.position = state->positions->next(place.site.caller_id);
  return place;
}

// Builds the record from the op's arguments. Tensors are copied to host memory now: after the
// start callback the inputs are no longer ours to read.
void fill_call(PendingCall& pending, const std::string& op, const c10::FunctionSchema* schema,
               c10::ArrayRef<c10::IValue> arguments, std::int64_t sequence_nr, std::int64_t index,
               const std::optional<CallPlace>& place) {
  AttentionCall& call = pending.call;
  const auto inputs = named_inputs(schema, arguments);
  const auto qkv = find_qkv(inputs);
  if (!qkv[0]) throw std::runtime_error(fmt::format("{}: no query/key/value tensors among its arguments", op));
  call.call_index = index;
  call.op = op;
  // flash-attn (and vLLM's and SGLang's builds of it) and xformers take (batch, seq, heads, dim) and
  // align causal masks bottom-right.
  const bool flash_style = op.rfind("flash_attn", 0) == 0 || op.rfind("_vllm_fa", 0) == 0 ||
                           op.rfind("sgl_kernel::", 0) == 0 || op.rfind("xformers", 0) == 0;
  call.layout = flash_style ? Layout::bshd : Layout::bhsd;
  call.causal_alignment = flash_style ? CausalAlignment::bottom_right : CausalAlignment::top_left;
  TensorCopies& copies = *pending.copies;
  if (qkv[0]->toTensor().is_cuda()) flush_before_cuda_exits(qkv[0]->toTensor());
  std::set<std::string> mapped = {"query", "q", "key", "k", "value", "v", "attn_mask", "mask", "attn_bias", "scale",
                                  "softmax_scale", "sm_scale", "is_causal", "causal", "dropout_p", "dropout",
                                  "p_dropout", "enable_gqa"};
  // There `k` and `v` are appended keys, kept as arguments: replay refuses them unless None.
  if (kv_cache_form(inputs)) {
    mapped.erase("k");
    mapped.erase("v");
  }
  // A Python entry point's call (python_entry_points.py): its output is an argument, given after the
  // call ran, and its other arguments come as text, by name.
  if (schema && schema->name() == kPythonCall) {
    // A substituted call's output is copied once the kernel's is in it (end_call).
    if (const auto* out = defined_tensor(find_input(inputs, {"out"}));
        out && pending.record && !pending.python_output && state->config.record_output) {
      copies.out = HostCopy::start(*out);
    }
    const auto* names = find_input(inputs, {"argument_names"});
    const auto* values = find_input(inputs, {"argument_values"});
    if (names && values && names->isList() && values->isList()) {
      const auto name_list = names->toListRef();
      const auto value_list = values->toListRef();
      for (std::size_t i = 0; i < name_list.size() && i < value_list.size(); ++i) {
        call.metadata["arg." + name_list[i].toStringRef()] = value_list[i].toStringRef();
      }
    }
    mapped.insert({"op", "out", "argument_names", "argument_values", "wall_s"});
  }
  // A resident call's tensors are described in the record at once (the kernel's checks read their
  // shapes) and copied to the host only if it is recorded.
  auto take = [&](const at::Tensor& tensor, std::optional<HostCopy>& copy, auto& field) {
    if (pending.resident) field = tensor_description(tensor);
    if (!pending.resident || pending.record) copy = HostCopy::start(tensor);
  };
  const bool dense = !map_ragged(inputs, qkv, call, copies, mapped);
  // Kernels take ALiBi slopes and sinks from the host: such calls go there.
  bool host_extensions = false;
  for (const char* name : {"alibi_slopes", "sinks", "learnable_sink", "s_aux"}) {
    host_extensions = host_extensions || defined_tensor(find_input(inputs, {name}));
  }
  if (dense && pending.resident_wanted && !host_extensions) {
    pending.resident = PendingCall::Resident{qkv[0]->toTensor(), qkv[1]->toTensor(), qkv[2]->toTensor(), std::nullopt};
  }
  if (dense) {
    take(qkv[0]->toTensor(), copies.q, call.q);
    take(qkv[1]->toTensor(), copies.k, call.k);
    take(qkv[2]->toTensor(), copies.v, call.v);
  }
  // Autograd passes an absent optional tensor as an undefined one.
  if (const auto* mask = find_input(inputs, {"attn_mask", "mask", "attn_bias"});
      mask && mask->isTensor() && mask->toTensor().defined()) {
    if (pending.resident) pending.resident->mask = mask->toTensor();
    take(mask->toTensor(), copies.mask, call.mask);
  }
  if (const auto* scale = find_input(inputs, {"scale", "softmax_scale", "sm_scale"}); scale && scale->isDouble()) {
    call.scale = scale->toDouble();
  }
  if (const auto* causal = find_input(inputs, {"is_causal", "causal"}); causal && causal->isBool()) {
    call.is_causal = causal->toBool();
  }
  if (const auto* dropout = find_input(inputs, {"dropout_p", "dropout", "p_dropout"}); dropout && dropout->isDouble()) {
    call.dropout_p = dropout->toDouble();
  }
  if (const auto* gqa = find_input(inputs, {"enable_gqa"}); gqa && gqa->isBool()) call.enable_gqa = gqa->toBool();
  // flash-attn's extensions, in the record's fields (-1 and 0 mean none, as flash-attn spells them).
  // A value in a form not recognised here is left to the arguments below, where replay refuses it.
  auto window_side = [&](const char* name, std::optional<std::int64_t>& side) {
    if (const auto* value = find_input(inputs, {name}); value && value->isInt()) {
      if (value->toInt() >= 0) side = value->toInt();
      mapped.insert(name);
    }
  };
  window_side("window_size_left", call.window_left);
  window_side("window_size_right", call.window_right);
  if (const auto* window = find_input(inputs, {"window_size"}); window && window->isIntList() &&
                                                                  window->toIntVector().size() == 2) {
    const auto sides = window->toIntVector();
    if (sides[0] >= 0) call.window_left = sides[0];
    if (sides[1] >= 0) call.window_right = sides[1];
    mapped.insert("window_size");
  }
  if (const auto* softcap = find_input(inputs, {"softcap"}); softcap && (softcap->isDouble() || softcap->isNone())) {
    call.softcap = softcap->isDouble() ? softcap->toDouble() : 0.0;
    mapped.insert("softcap");
  }
  auto optional_tensor = [&](const char* name, std::optional<HostCopy>& copy) {
    const auto* value = find_input(inputs, {name});
    if (!value || !(value->isNone() || value->isTensor())) return;
    if (value->isTensor() && value->toTensor().defined()) copy = HostCopy::start(value->toTensor());
    mapped.insert(name);
  };
  optional_tensor("alibi_slopes", copies.alibi_slopes);
  for (const char* name : {"sinks", "learnable_sink", "s_aux"}) optional_tensor(name, copies.sinks);
  // Every other argument, as given, so nothing about the call is lost.
  for (const auto& input : inputs) {
    if (mapped.count(input.name) || (input.value == qkv[0] || input.value == qkv[1] || input.value == qkv[2])) continue;
    // Other tensors (ALiBi slopes, a block table, cu_seqlens) are named with their dtype and shape,
    // so that replay knows they were there; an absent optional tensor is None.
    std::string text;
    if (input.value->isTensor()) {
      const at::Tensor& tensor = input.value->toTensor();
      text = tensor.defined() ? fmt::format("tensor {} [{}]", c10::toString(tensor.scalar_type()), fmt::join(tensor.sizes(), ","))
                              : "None";
    } else {
      text = scalar_text(*input.value);
    }
    if (!text.empty()) call.metadata["arg." + input.name] = text;
  }
  call.metadata["pid"] = std::to_string(getpid());
  call.metadata["thread"] = thread_label();
  call.metadata["time_unix_s"] = fmt::format("{:.6f}", std::chrono::duration<double>(
                                                          std::chrono::system_clock::now().time_since_epoch()).count());
  call.metadata["sequence_nr"] = std::to_string(sequence_nr);
  if (!state->rank.empty()) call.metadata["rank"] = state->rank;
  if (place) {
    if (!place->site.location.empty()) call.metadata["call_site"] = place->site.location;
    if (!place->site.caller_class.empty()) call.metadata["caller"] = place->site.caller_class;
    call.metadata["step"] = std::to_string(place->position.step);
    call.metadata["layer"] = std::to_string(place->position.layer);
  }
}

void report_failure_once(const std::exception& error) {
  static std::once_flag reported;
  std::call_once(reported, [&] {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
    std::fprintf(stderr, "[attncap] a call was not captured: %s\n",
                 c10_error ? c10_error->what_without_backtrace() : error.what());
  });
}

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

// Which call this is, and whether it is recorded: every call counts, recorded or not.
struct Selection {
  std::int64_t index;
  bool wanted;
};

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

// Under ATTNCAP_SUBSTITUTE: whether the kernel is to be asked for this call, or why not.
void judge_substitution(PendingCall& pending, const std::string& op, const c10::FunctionSchema* schema, bool hooked,
                        c10::ArrayRef<c10::IValue> inputs, std::int64_t index, const std::optional<CallPlace>& place) {
  const auto qkv = find_qkv(named_inputs(schema, inputs));
  if (!qkv[0]) {
    pending.left_reason = fmt::format("{}: no query/key/value tensors among its arguments", op);
    return;
  }
  const at::Tensor& query = qkv[0]->toTensor();
  pending.on_gpu = query.is_cuda();
  // A Python entry point (FlashInfer's) has returned already: the output it returned, handed over as
  // `out`, is overwritten, as after an op that ran (substitute_after_the_op).
  const bool python_call = schema && schema->name() == kPythonCall;
  const at::Tensor* python_out = python_call ? defined_tensor(find_input(named_inputs(schema, inputs), {"out"})) : nullptr;
  if (python_call && !python_out) {
    pending.left_reason = fmt::format("{} handed over no output to replace", op);
    return;
  }
  auto reason = state->substituter->declines_early(
      index, place ? std::optional(place->position.layer) : std::nullopt,
      place ? std::optional(place->position.step) : std::nullopt, query, qkv[1]->toTensor(), qkv[2]->toTensor());
  if (reason) {
    pending.left_reason = std::move(*reason);
    return;
  }
  pending.substitute = true;
  if (python_out) pending.python_output = *python_out;
  // A Python entry point's call is recorded in its library's layout, which the replay's host path reads.
  pending.resident_wanted = !python_call && state->substituter->takes_resident(query);
  // A hooked op that returns the attention output alone is not run at all (substitute_hooked).
  const bool returns_one_tensor =
      schema && schema->returns().size() == 1 && schema->returns()[0].type()->kind() == c10::TypeKind::TensorType;
  pending.after_the_op = !(hooked && returns_one_tensor);
}

// A matched op starts: the outermost one becomes a call (recorded if selected, or as `preselected`
// says; substituted where ATTNCAP_SUBSTITUTE takes it); one inside it names the backend that ran.
std::unique_ptr<at::ObserverContext> begin_call(const std::string& op, const c10::FunctionSchema* schema,
                                                c10::ArrayRef<c10::IValue> inputs, std::int64_t sequence_nr,
                                                bool hooked, std::optional<Selection> preselected = std::nullopt) {
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
    if (state->substituter) judge_substitution(*pending, op, schema, hooked, inputs, selection.index, place);
    if (selection.wanted || pending->substitute) {
      at::RecordFunctionGuard no_observers(false);  // our copies must not be observed
      c10::AutoGradMode no_grad(false);
      pending->record = selection.wanted;
      fill_call(*pending, op, schema, inputs, sequence_nr, selection.index, place);
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

// The attention output among an op's outputs: the first defined tensor, also where the op returns
// a list (vLLM's builds of flash-attn return Tensor[]: the output, then the log-sum-exp).
const at::Tensor* attention_output(c10::ArrayRef<c10::IValue> outputs) {
  for (const c10::IValue& output : outputs) {
    if (output.isTensor() && output.toTensor().defined()) return &output.toTensor();
    if (output.isList()) {
      for (const c10::IValue& element : output.toListRef()) {
        if (element.isTensor() && element.toTensor().defined()) return &element.toTensor();
      }
      return nullptr;
    }
  }
  return nullptr;
}

std::string describe_failure(const std::exception& error) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
  return fmt::format("substitution failed: {}", c10_error ? c10_error->what_without_backtrace() : error.what());
}

// The kernel's output for a call judged its to take: on the op's tensors where it takes them there,
// else from the call's host copies (finished here, on the job's thread).
std::variant<at::Tensor, std::string> compute_substitute(PendingCall& pending, c10::IntArrayRef sizes,
                                                         const at::TensorOptions& options) {
  if (const auto& r = pending.resident) {
    return state->substituter->compute_resident(pending.call, r->q, r->k, r->v, r->mask, sizes, options);
  }
  pending.copies->finish_into(pending.call);
  return state->substituter->compute(pending.call, sizes, options);
}

// Substitution after the op ran: its attention output overwritten in place by the kernel's, so
// that whatever holds it (the job, the op's other outputs' consumers) sees the kernel's values.
void substitute_after_the_op(PendingCall& pending, c10::ArrayRef<c10::IValue> outputs) {
  try {
    at::RecordFunctionGuard no_observers(false);
    c10::AutoGradMode no_grad(false);
    const at::Tensor* found = pending.python_output ? &*pending.python_output : attention_output(outputs);
    if (!found) {
      pending.left_reason = "the op returned no attention output to replace";
      return;
    }
    at::Tensor output = *found;
    auto computed = compute_substitute(pending, output.sizes(), output.options());
    if (auto* reason = std::get_if<std::string>(&computed)) {
      pending.left_reason = std::move(*reason);
      return;
    }
    output.copy_(std::get<at::Tensor>(computed));
    pending.substituted = true;
  } catch (const std::exception& error) {
    pending.left_reason = describe_failure(error);
  }
}

// A matched op ends. `outputs` is null when its kernel threw: nothing is recorded then.
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

std::unique_ptr<at::ObserverContext> begin_hooked(const std::string& op, const c10::FunctionSchema& schema,
                                                  c10::ArrayRef<c10::IValue> inputs) {
  return begin_call(op, &schema, inputs, static_cast<std::int64_t>(at::sequence_number::peek()), /*hooked=*/true);
}

// The hook's substitution (ATTNCAP_SUBSTITUTE): the kernel's output in place of the op's, where
// begin_call judged the call the kernel's to take and the kernel takes it. Otherwise the op runs,
// and the reason is counted.
bool substitute_hooked(at::ObserverContext* context, const c10::FunctionSchema& schema, torch::jit::Stack* stack) {
  auto* pending = dynamic_cast<PendingCall*>(context);
  if (!pending || !pending->substitute || pending->after_the_op) return false;
  try {
    at::RecordFunctionGuard no_observers(false);
    c10::AutoGradMode no_grad(false);
    const std::size_t count = schema.arguments().size();
    const c10::ArrayRef<c10::IValue> inputs(stack->data() + stack->size() - count, count);
    const auto qkv = find_qkv(named_inputs(&schema, inputs));
    const at::Tensor& query = qkv[0]->toTensor();
    // SDPA's output: the query's leading dims and the value's head dim, in the query's dtype.
    std::vector<std::int64_t> sizes = query.sizes().vec();
    sizes.back() = qkv[2]->toTensor().size(-1);
    auto computed = compute_substitute(*pending, sizes, query.options());
    if (auto* reason = std::get_if<std::string>(&computed)) {
      pending->left_reason = std::move(*reason);
      return false;
    }
    torch::jit::drop(*stack, count);
    torch::jit::push(*stack, std::move(std::get<at::Tensor>(computed)));
    pending->substituted = true;
    return true;
  } catch (const std::exception& error) {
    pending->left_reason = describe_failure(error);
    return false;
  }
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

// A Python entry point's call is selected first (attncap::select_python_call), so that the Python
// side describes only the calls recorded or, under ATTNCAP_SUBSTITUTE, to be substituted;
// attncap::python_call then takes the one selected on its thread.
thread_local std::optional<Selection> python_selection;

// attncap::select_python_call's kernel: counts the call, and says whether the Python side is to
// describe it.
void select_python_call_kernel(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  const std::string name = stack->back().toStringRef();
  torch::jit::drop(*stack, 1);
  python_selection.reset();
  bool wanted = false;
  if (state && op_wanted(name)) {
    try {
      // Under substitution every call is described, recorded or not: the kernel may take it.
      const Selection selection = select_call();
      if (selection.wanted || state->substituter) python_selection = selection;
      wanted = python_selection.has_value();
    } catch (const std::exception& error) {
      count_failed();
      report_failure_once(error);
    }
  }
  torch::jit::push(*stack, wanted);
}

// attncap::python_call's kernel: the call selected, under the entry point's own name, is recorded
// and substituted as a matched op's would be (it has run already: its output is the `out` given).
void python_call_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const std::size_t count = schema.arguments().size();
  const c10::ArrayRef<c10::IValue> inputs(stack->data() + stack->size() - count, count);
  const std::optional<Selection> selection = python_selection;
  python_selection.reset();
  if (state && selection && inputs[0].isString()) {
    auto context = begin_call(inputs[0].toStringRef(), &schema, inputs,
                              static_cast<std::int64_t>(at::sequence_number::peek()), /*hooked=*/false, selection);
    // duration_s is the entry point's own wall time, as the Python side measured it, plus the copies.
    const c10::IValue* wall = find_input(named_inputs(&schema, inputs), {"wall_s"});
    if (auto* pending = dynamic_cast<PendingCall*>(context.get()); pending && wall && wall->isDouble()) {
      pending->started -= std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(wall->toDouble()));
    }
    const c10::ArrayRef<c10::IValue> no_outputs;
    end_call(context.get(), &no_outputs);
  }
  torch::jit::drop(*stack, count);
}

// Defines the ops python_entry_points.py calls. Done at start, not when the part loads, so that
// nothing of it can fail inside dlopen. python_call's arguments after `out` are flash-attn's names
// for what the record holds (FlashInfer's for its paged form).
void define_python_call_ops() {
  static auto* library = new torch::Library(torch::Library::DEF, "attncap", std::nullopt, __FILE__, __LINE__);
  library->def("select_python_call(str op) -> bool",
               torch::dispatch(c10::DispatchKey::CompositeExplicitAutograd,
                               torch::CppFunction::makeFromBoxedFunction<&select_python_call_kernel>()));
  library->def("python_call(str op, Tensor q, Tensor k, Tensor v, Tensor out, *, Tensor? cu_seqlens_q=None, "
               "Tensor? cu_seqlens_k=None, Tensor? seqused_k=None, Tensor? block_table=None, "
               "Tensor? paged_kv_indptr=None, Tensor? paged_kv_indices=None, Tensor? paged_kv_last_page_len=None, "
               "Tensor? alibi_slopes=None, Tensor? sinks=None, float? softmax_scale=None, bool causal=False, "
               "int window_size_left=-1, int window_size_right=-1, float softcap=0., float wall_s=0., "
               "str[] argument_names, str[] argument_values) -> ()",
               torch::dispatch(c10::DispatchKey::CompositeExplicitAutograd,
                               torch::CppFunction::makeFromBoxedFunction<&python_call_kernel>()));
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
