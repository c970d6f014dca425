// A call's record from its op's arguments (observation.h: fill_call): the record's fields by the
// names the op's schema gives, its tensors' host copies started, ragged and paged batches planned
// as ragged_map.h says, and every other argument kept by name, so that nothing about the call is
// lost and replay can refuse what it cannot honour.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <chrono>

#include "capture/observation.h"
#include "capture/ragged_map.h"
#include "formats/torch_tensor.h"

namespace attnreplay::capture {
namespace {

std::string thread_label() {
  return std::to_string(static_cast<long long>(gettid()));
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
  if (planned->kv_gathered) {
    copies.k = HostCopy::take(planned->k);
    copies.v = HostCopy::take(planned->v);
  } else {
    start(planned->k, copies.k);
    start(planned->v, copies.v);
  }
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

}  // namespace

void fill_call(PendingCall& pending, const std::string& op, const c10::FunctionSchema* schema,
               const CallArguments& arguments, std::int64_t sequence_nr, std::int64_t index,
               const std::optional<CallPlace>& place) {
  AttentionCall& call = pending.call;
  const auto& inputs = arguments.named;
  const auto& qkv = arguments.qkv;
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
  constexpr const char* kSinkNames[] = {"sinks", "learnable_sink", "s_aux"};
  bool host_extensions = defined_tensor(find_input(inputs, {"alibi_slopes"})) != nullptr;
  for (const char* name : kSinkNames) host_extensions = host_extensions || defined_tensor(find_input(inputs, {name}));
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
  for (const char* name : kSinkNames) optional_tensor(name, copies.sinks);
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

}  // namespace attnreplay::capture
