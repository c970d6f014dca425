// FlashInfer-Trace out: a captured call as a workload of the definition FlashInfer names for it
// (formats/flashinfer_trace.h); the reading is in flashinfer_trace.cpp.
#include "formats/flashinfer_trace.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>

#include "formats/content_hash.h"
#include "formats/errors.h"
#include "formats/mask_structure.h"
#include "formats/safetensors_format.h"

namespace attnreplay {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
// A definition's inputs and outputs are in the kernel's argument order, which the file keeps.
using ordered_json = nlohmann::ordered_json;
using Shape = std::vector<std::int64_t>;

// ---- What a definition computes, in Python, as its `reference` field holds it ----

// Shared by every definition: one sequence's attention, its log-sum-exp in base 2 as FlashInfer
// returns it, causality bottom-right (the last query sees every key).
constexpr const char* kReferenceCommon = R"(import math

import torch

CAUSAL = {causal}


def _attend(q, k, v, sm_scale, output, lse):
    # q (rows, Hq, Dqk); k (keys, Hkv, Dqk); v (keys, Hkv, Dv); query head h reads key head h // (Hq // Hkv).
    if q.shape[0] == 0:
        return
    group = q.shape[1] // k.shape[1]
    keys = k.float().repeat_interleave(group, dim=1)
    values = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), keys) * sm_scale
    if CAUSAL:
        last_key = torch.arange(q.shape[0], device=q.device)[:, None] + (k.shape[0] - q.shape[0])
        scores = scores.masked_fill(torch.arange(k.shape[0], device=q.device)[None, :] > last_key, -math.inf)
    lse.copy_((torch.logsumexp(scores, dim=-1) / math.log(2.0)).transpose(0, 1))
    output.copy_(torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), values).to(output.dtype))


def _outputs(q, head_dim_vo):
    output = torch.zeros(q.shape[0], q.shape[1], head_dim_vo, dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[0], q.shape[1]), -math.inf, dtype=torch.float32, device=q.device)
    return output, lse
)";

constexpr const char* kReferenceRagged = R"(

def run(q, k, v, qo_indptr, kv_indptr, sm_scale):
    output, lse = _outputs(q, v.shape[2])
    for b in range(qo_indptr.shape[0] - 1):
        q0, q1, k0, k1 = int(qo_indptr[b]), int(qo_indptr[b + 1]), int(kv_indptr[b]), int(kv_indptr[b + 1])
        _attend(q[q0:q1], k[k0:k1], v[k0:k1], sm_scale, output[q0:q1], lse[q0:q1])
    return output, lse
)";

// Paged: sequence b's keys are the pages kv_indices[kv_indptr[b]:kv_indptr[b + 1]], whole.
constexpr const char* kReferencePaged = R"(

def _sequences(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    output, lse = _outputs(q, v_cache.shape[-1])
    for b in range(kv_indptr.shape[0] - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        pages = kv_indices[int(kv_indptr[b]):int(kv_indptr[b + 1])].long()
        k = k_cache[pages].reshape(-1, k_cache.shape[-2], k_cache.shape[-1])
        v = v_cache[pages].reshape(-1, v_cache.shape[-2], v_cache.shape[-1])
        _attend(q[q0:q1], k, v, sm_scale, output[q0:q1], lse[q0:q1])
    return output, lse
)";

constexpr const char* kRunPagedDecode = R"(

def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    one_each = torch.arange(q.shape[0] + 1, device=q.device)
    return _sequences(q, k_cache, v_cache, one_each, kv_indptr, kv_indices, sm_scale)
)";

constexpr const char* kRunPagedPrefill = R"(

def run(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    return _sequences(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, sm_scale)
)";

// MLA with its matrices absorbed: queries [q_nope, q_pe] over one key head [ckv, kpe] and one value
// head ckv.
constexpr const char* kRunMlaDecode = R"(

def run(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale):
    q = torch.cat([q_nope, q_pe], dim=-1)
    k_cache = torch.cat([ckv_cache, kpe_cache], dim=-1).unsqueeze(-2)
    one_each = torch.arange(q.shape[0] + 1, device=q.device)
    return _sequences(q, k_cache, ckv_cache.unsqueeze(-2), one_each, kv_indptr, kv_indices, sm_scale)
)";

constexpr const char* kRunMlaPrefill = R"(

def run(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    q = torch.cat([q_nope, q_pe], dim=-1)
    k_cache = torch.cat([ckv_cache, kpe_cache], dim=-1).unsqueeze(-2)
    return _sequences(q, k_cache, ckv_cache.unsqueeze(-2), qo_indptr, kv_indptr, kv_indices, sm_scale)
)";

// ---- The definition's JSON ----

std::string dtype_suffix(DType dtype) {
  switch (dtype) {
    case DType::bfloat16: return "";  // the dataset's own definitions are bfloat16
    case DType::float16: return "_fp16";
    case DType::float32: return "_fp32";
    case DType::float8_e4m3fn: return "_fp8_e4m3";
    case DType::float8_e5m2: return "_fp8_e5m2";
    default: return fmt::format("_{}", dtype_name(dtype));
  }
}

ordered_json tensor_spec(const std::vector<std::string>& axes, DType dtype) {
  return {{"shape", axes}, {"dtype", dtype_name(dtype)}};
}
ordered_json scalar_spec() { return {{"shape", nullptr}, {"dtype", "float32"}}; }
ordered_json var_axis(const char* description) { return {{"type", "var"}, {"description", description}}; }
ordered_json const_axis(std::int64_t value) { return {{"type", "const"}, {"value", value}}; }

// A paged definition's variable axes (GQA's and MLA's alike); its constant ones go after them.
ordered_json paged_var_axes(const char* qo_rows, bool decode) {
  return {{qo_rows, var_axis(decode ? "sequences, one query each" : "queries of every sequence")},
          {"num_pages", var_axis("pages of the KV cache")},
          {"len_indptr", var_axis("sequences + 1")},
          {"num_kv_indices", var_axis("pages the sequences read")}};
}

// ---- A call as FlashInfer's definitions see it: sequences of packed rows ----

// One sequence's rows in the call's tensors: batch element `batch` of a dense call, or the
// gathered sequence call of a ragged one (then batch 0 of a bshd call).
struct SequenceView {
  AttentionCall call;  // dense: the call itself (shared bytes); ragged: sequence_call(b)
  std::int64_t batch = 0;
  std::vector<std::int64_t> kept_rows;  // query rows that see a key
  std::int64_t k_begin = 0, k_end = 0;  // the keys they see, [k_begin, k_end)
  bool causal_fits = true, full_fits = true;
};

// Row `row` of (batch, head) of a bhsd or bshd tensor.
const std::byte* row_of(const HostTensor& tensor, Layout layout, std::int64_t batch, std::int64_t head, std::int64_t row) {
  const std::int64_t heads = layout == Layout::bhsd ? tensor.shape[1] : tensor.shape[2];
  const std::int64_t seq = layout == Layout::bhsd ? tensor.shape[2] : tensor.shape[1];
  const std::int64_t dim = tensor.shape[3];
  const std::int64_t index = layout == Layout::bhsd ? ((batch * heads + head) * seq + row) * dim : ((batch * seq + row) * heads + head) * dim;
  return tensor.data() + static_cast<std::size_t>(index) * dtype_size(tensor.dtype);
}

// Finds which rows see keys, and whether they see them as causal (bottom-right) or full: the
// call's visibility (formats/mask_structure.h), which must be the same for every head.
void analyse(SequenceView& view) {
  const AttentionCall& call = view.call;
  const std::shared_ptr<const CallVisibility> visibility = visibility_of(call);
  if (visibility->dense_mask) {
    throw NotRepresentable(fmt::format("{}: its mask is {}: FlashInfer's definitions take none", call.where(),
                                       visibility->mask_found));
  }
  if (visibility->structure.heads > 1) {
    throw NotRepresentable(fmt::format("{}: a mask that differs between heads: FlashInfer's definitions take none",
                                       call.where()));
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  for (std::int64_t i = 0; i < call.shape().seq_q; ++i) {
    const auto range = visibility->structure.row_keys(view.batch, 0, i);
    if (range.first >= range.second) continue;  // a pad: it sees no key and is left out
    view.kept_rows.push_back(i);
    ranges.push_back(range);
  }
  if (ranges.empty()) return;
  view.k_begin = ranges.front().first;
  for (const auto& [first, end] : ranges) view.k_end = std::max(view.k_end, end);
  const auto n = static_cast<std::int64_t>(ranges.size());
  for (std::int64_t r = 0; r < n; ++r) {
    const auto [first, end] = ranges[static_cast<std::size_t>(r)];
    if (first != view.k_begin) {
      throw NotRepresentable(fmt::format("{}: query rows start at different keys (a window or a mask other than padding and "
                                         "causality): FlashInfer's definitions take none",
                                         call.where()));
    }
    view.full_fits = view.full_fits && end == view.k_end;
    view.causal_fits = view.causal_fits && end == view.k_end - (n - 1 - r);
  }
  if (!view.full_fits && !view.causal_fits) {
    throw NotRepresentable(fmt::format("{}: query rows see keys neither causally (bottom-right) nor all alike: FlashInfer's "
                                       "definitions take neither",
                                       call.where()));
  }
}

// What FlashInfer-Trace gets for one call.
struct Workload {
  std::string definition_name, op_type;
  ordered_json definition;
  json axes;
  std::vector<std::pair<std::string, HostTensor>> tensors;  // in the definition's input order
  double sm_scale = 0;
  std::optional<HostTensor> output;  // the model's output, rows as q's (kept beside the inputs)
};

std::string refusal_of_extensions(const AttentionCall& call) {
  if (call.dropout_p > 0) return "dropout";
  for (const auto extension : call.extensions()) return call.describe(extension);
  if (call.q.dtype != call.k.dtype || call.q.dtype != call.v.dtype) return "q, k and v of different dtypes";
  if (!dtype_is_floating(call.q.dtype) || call.q.dtype == DType::float64) {
    return fmt::format("{} inputs (FlashInfer-Trace's definitions take bfloat16, float16, float32, float8)", dtype_name(call.q.dtype));
  }
  if (call.is_ragged() && call.mask) return "a mask on a ragged batch";
  return {};
}

Workload map_call(const AttentionCall& call) {
  if (const std::string reason = refusal_of_extensions(call); !reason.empty()) {
    throw NotRepresentable(fmt::format("{}: {}: FlashInfer's attention definitions take none", call.where(), reason));
  }
  const AttentionShape s = call.shape();
  std::vector<SequenceView> views;
  if (call.is_ragged()) {
    const auto sequences = call.sequences();
    for (std::size_t b = 0; b < sequences.size(); ++b) views.push_back({call.sequence_call(b, sequences), 0});
  } else {
    AttentionCall read = call;  // its mask read once for all its sequences
    if (!read.visibility) read.visibility = std::make_shared<const CallVisibility>(read_call_visibility(call));
    for (std::int64_t b = 0; b < s.batch; ++b) views.push_back({read, b});
  }
  for (auto& view : views) analyse(view);
  std::erase_if(views, [](const SequenceView& view) { return view.kept_rows.empty(); });
  if (views.empty()) throw NotRepresentable(fmt::format("{}: no query sees a key", call.where()));
  const bool decode = std::all_of(views.begin(), views.end(), [](const auto& v) { return v.kept_rows.size() == 1; });
  const bool causal = !decode && std::any_of(views.begin(), views.end(), [](const auto& v) { return !v.full_fits; });
  if (causal && std::any_of(views.begin(), views.end(), [](const auto& v) { return !v.causal_fits; })) {
    throw NotRepresentable(fmt::format("{}: some sequences causal and others not: one definition is one or the other", call.where()));
  }

  // Pack the kept rows: q (total_q, Hq, Dqk), k and v (total_kv, Hkv, D), out (total_q, Hq, Dv).
  std::int64_t total_q = 0, total_kv = 0;
  std::vector<std::int64_t> qo_indptr{0}, kv_indptr{0};
  for (const auto& view : views) {
    total_q += static_cast<std::int64_t>(view.kept_rows.size());
    total_kv += view.k_end - view.k_begin;
    qo_indptr.push_back(total_q);
    kv_indptr.push_back(total_kv);
  }
  auto pack = [&](auto&& tensor_of, std::int64_t rows, std::int64_t heads, std::int64_t dim, bool query_rows) {
    const HostTensor& like = tensor_of(views.front().call);
    HostTensor packed = HostTensor::allocate(like.dtype, {rows, heads, dim});
    const std::size_t row_bytes = static_cast<std::size_t>(dim) * dtype_size(like.dtype);
    std::byte* to = packed.mutable_data();
    for (const auto& view : views) {
      const HostTensor& from = tensor_of(view.call);
      const Layout layout = view.call.layout;
      auto copy_row = [&](std::int64_t row) {
        for (std::int64_t h = 0; h < heads; ++h, to += row_bytes) std::memcpy(to, row_of(from, layout, view.batch, h, row), row_bytes);
      };
      if (query_rows) {
        for (const std::int64_t row : view.kept_rows) copy_row(row);
      } else {
        for (std::int64_t row = view.k_begin; row < view.k_end; ++row) copy_row(row);
      }
    }
    return packed;
  };
  HostTensor q = pack([](const AttentionCall& c) -> const HostTensor& { return c.q; }, total_q, s.heads_q, s.head_dim_qk, true);
  HostTensor k = pack([](const AttentionCall& c) -> const HostTensor& { return c.k; }, total_kv, s.heads_kv, s.head_dim_qk, false);
  HostTensor v = pack([](const AttentionCall& c) -> const HostTensor& { return c.v; }, total_kv, s.heads_kv, s.head_dim_vo, false);
  std::optional<HostTensor> out;
  if (call.out) out = pack([](const AttentionCall& c) -> const HostTensor& { return *c.out; }, total_q, s.heads_q, s.head_dim_vo, true);

  Workload w;
  w.sm_scale = call.softmax_scale();
  w.output = std::move(out);
  const DType dtype = call.q.dtype;
  const std::string suffix = dtype_suffix(dtype);
  const auto batch = static_cast<std::int64_t>(views.size());
  const bool mla = s.heads_kv == 1 && s.head_dim_qk > s.head_dim_vo &&
                   std::memcmp(last_dim_slice(k, 0, s.head_dim_vo).data(), v.data(), v.nbytes()) == 0;
  ordered_json axes_def, inputs_def, outputs_def;
  std::vector<std::string> constraints;
  std::string reference = fmt::format(fmt::runtime(kReferenceCommon), fmt::arg("causal", causal ? "True" : "False"));
  const char* qo_rows = decode ? "batch_size" : "total_q";
  if (mla) {
    const std::int64_t ckv = s.head_dim_vo, kpe = s.head_dim_qk - s.head_dim_vo;
    w.op_type = "mla_paged";
    w.definition_name = decode ? fmt::format("mla_paged_decode_h{}_ckv{}_kpe{}_ps1{}", s.heads_q, ckv, kpe, suffix)
                               : fmt::format("mla_paged_prefill{}_h{}_ckv{}_kpe{}_ps1{}", causal ? "_causal" : "", s.heads_q, ckv, kpe, suffix);
    axes_def = paged_var_axes(qo_rows, decode);
    axes_def["num_qo_heads"] = const_axis(s.heads_q);
    axes_def["head_dim_ckv"] = const_axis(ckv);
    axes_def["head_dim_kpe"] = const_axis(kpe);
    axes_def["page_size"] = const_axis(1);
    inputs_def = {{"q_nope", tensor_spec({qo_rows, "num_qo_heads", "head_dim_ckv"}, dtype)},
                  {"q_pe", tensor_spec({qo_rows, "num_qo_heads", "head_dim_kpe"}, dtype)},
                  {"ckv_cache", tensor_spec({"num_pages", "page_size", "head_dim_ckv"}, dtype)},
                  {"kpe_cache", tensor_spec({"num_pages", "page_size", "head_dim_kpe"}, dtype)}};
    w.tensors = {{"q_nope", last_dim_slice(q, 0, ckv)},
                 {"q_pe", last_dim_slice(q, ckv, kpe)},
                 {"ckv_cache", with_shape(last_dim_slice(k, 0, ckv), {total_kv, 1, ckv})},
                 {"kpe_cache", with_shape(last_dim_slice(k, ckv, kpe), {total_kv, 1, kpe})}};
    outputs_def = {{"output", tensor_spec({qo_rows, "num_qo_heads", "head_dim_ckv"}, dtype)}};
    reference += decode ? kReferencePaged + std::string(kRunMlaDecode) : kReferencePaged + std::string(kRunMlaPrefill);
  } else if (decode || call.is_paged()) {
    w.op_type = "gqa_paged";
    w.definition_name = decode ? fmt::format("gqa_paged_decode_h{}_kv{}_d{}_ps1{}", s.heads_q, s.heads_kv, s.head_dim_qk, suffix)
                               : fmt::format("gqa_paged_prefill{}_h{}_kv{}_d{}_ps1{}", causal ? "_causal" : "", s.heads_q,
                                             s.heads_kv, s.head_dim_qk, suffix);
    axes_def = paged_var_axes(qo_rows, decode);
    axes_def["num_qo_heads"] = const_axis(s.heads_q);
    axes_def["num_kv_heads"] = const_axis(s.heads_kv);
    axes_def["head_dim"] = const_axis(s.head_dim_qk);
    axes_def["page_size"] = const_axis(1);
    inputs_def = {{"q", tensor_spec({qo_rows, "num_qo_heads", "head_dim"}, dtype)},
                  {"k_cache", tensor_spec({"num_pages", "page_size", "num_kv_heads", "head_dim"}, dtype)},
                  {"v_cache", tensor_spec({"num_pages", "page_size", "num_kv_heads", "head_dim"}, dtype)}};
    w.tensors = {{"q", q},
                 {"k_cache", with_shape(k, {total_kv, 1, s.heads_kv, s.head_dim_qk})},
                 {"v_cache", with_shape(v, {total_kv, 1, s.heads_kv, s.head_dim_vo})}};
    outputs_def = {{"output", tensor_spec({qo_rows, "num_qo_heads", "head_dim"}, dtype)}};
    reference += decode ? kReferencePaged + std::string(kRunPagedDecode) : kReferencePaged + std::string(kRunPagedPrefill);
  } else {
    w.op_type = "gqa_ragged";
    w.definition_name = fmt::format("gqa_ragged_prefill{}_h{}_kv{}_d{}{}", causal ? "_causal" : "", s.heads_q, s.heads_kv,
                                    s.head_dim_qk, suffix);
    axes_def = {{"total_q", var_axis("queries of every sequence")},
                {"total_kv", var_axis("keys of every sequence")},
                {"len_indptr", var_axis("sequences + 1")},
                {"num_qo_heads", const_axis(s.heads_q)},
                {"num_kv_heads", const_axis(s.heads_kv)},
                {"head_dim", const_axis(s.head_dim_qk)}};
    inputs_def = {{"q", tensor_spec({"total_q", "num_qo_heads", "head_dim"}, dtype)},
                  {"k", tensor_spec({"total_kv", "num_kv_heads", "head_dim"}, dtype)},
                  {"v", tensor_spec({"total_kv", "num_kv_heads", "head_dim"}, dtype)},
                  {"qo_indptr", tensor_spec({"len_indptr"}, DType::int32)},
                  {"kv_indptr", tensor_spec({"len_indptr"}, DType::int32)}};
    w.tensors = {{"q", q}, {"k", k}, {"v", v}, {"qo_indptr", int32_tensor(qo_indptr)}, {"kv_indptr", int32_tensor(kv_indptr)}};
    outputs_def = {{"output", tensor_spec({"total_q", "num_qo_heads", "head_dim"}, dtype)}};
    constraints = {"total_q == qo_indptr[-1]", "total_kv == kv_indptr[-1]"};
    reference += kReferenceRagged;
    w.axes = {{"total_q", total_q}, {"total_kv", total_kv}, {"len_indptr", batch + 1}};
  }
  if (w.op_type != "gqa_ragged") {
    if (!decode) {
      inputs_def["qo_indptr"] = tensor_spec({"len_indptr"}, DType::int32);
      w.tensors.emplace_back("qo_indptr", int32_tensor(qo_indptr));
      constraints.push_back("total_q == qo_indptr[-1]");
    }
    inputs_def["kv_indptr"] = tensor_spec({"len_indptr"}, DType::int32);
    inputs_def["kv_indices"] = tensor_spec({"num_kv_indices"}, DType::int32);
    w.tensors.emplace_back("kv_indptr", int32_tensor(kv_indptr));
    std::vector<std::int64_t> every_key(static_cast<std::size_t>(total_kv));  // pages of one token, in order
    std::iota(every_key.begin(), every_key.end(), std::int64_t{0});
    w.tensors.emplace_back("kv_indices", int32_tensor(every_key));
    constraints.push_back("num_kv_indices == kv_indptr[-1]");
    w.axes = {{qo_rows, decode ? batch : total_q}, {"num_pages", total_kv}, {"len_indptr", batch + 1}, {"num_kv_indices", total_kv}};
  }
  inputs_def["sm_scale"] = scalar_spec();
  outputs_def["lse"] = tensor_spec({qo_rows, "num_qo_heads"}, DType::float32);
  w.definition = {{"name", w.definition_name},
                  {"op_type", w.op_type},
                  {"description", fmt::format("{} attention{}, as attnreplay writes a captured call (log-sum-exp in base 2)",
                                              decode ? "Decode" : causal ? "Causal (bottom-right) prefill" : "Prefill",
                                              mla ? " (MLA, matrices absorbed)" : "")},
                  {"tags", {"origin:attnreplay"}},
                  {"axes", axes_def},
                  {"constraints", constraints},
                  {"inputs", inputs_def},
                  {"outputs", outputs_def},
                  {"reference", reference}};
  return w;
}

// A workload's uuid from its content, so that converting the same capture twice writes the same
// workloads (and a folder written to again keeps one of each).
std::string content_uuid(const Workload& w) {
  std::uint64_t a = content_hash(w.definition_name.data(), w.definition_name.size());
  std::uint64_t b = a ^ 0x9e3779b97f4a7c15ULL;
  for (const auto& [name, tensor] : w.tensors) {
    const std::uint64_t h = content_hash(tensor.data(), tensor.nbytes());
    a = a * 31 + h;
    b = (b ^ h) * 0x100000001b3ULL;
  }
  const std::string hex = fmt::format("{:016x}{:016x}", a, b);
  return fmt::format("{}-{}-{}-{}-{}", hex.substr(0, 8), hex.substr(8, 4), hex.substr(12, 4), hex.substr(16, 4), hex.substr(20, 12));
}

class FlashInferTraceWriter final : public CaptureWriter {
 public:
  FlashInferTraceWriter(std::string folder, std::string producer) : root_(std::move(folder)), producer_(std::move(producer)) {
    std::error_code error;
    fs::create_directories(root_, error);
    if (error) throw_input_error(root_.string(), "cannot create folder: {}", error.message());
  }

  void append(const AttentionCall& call) override {
    const Workload w = map_call(call);
    write_definition(w);
    const fs::path workloads = root_ / "workloads" / w.op_type / (w.definition_name + ".jsonl");
    const std::string uuid = content_uuid(w);
    if (known_uuids(workloads).count(uuid)) return;  // already there: the same tensors under the same name
    const fs::path blob_relative = fs::path("blob") / "workloads" / w.op_type / w.definition_name / (w.definition_name + "_" + uuid + ".safetensors");
    std::error_code error;
    fs::create_directories((root_ / blob_relative).parent_path(), error);
    std::vector<std::pair<std::string, const HostTensor*>> tensors;
    json inputs = json::object();
    for (const auto& [name, tensor] : w.tensors) {
      tensors.emplace_back(name, &tensor);
      inputs[name] = {{"type", "safetensors"}, {"path", blob_relative.generic_string()}, {"tensor_key", name}};
    }
    inputs["sm_scale"] = {{"type", "scalar"}, {"value", w.sm_scale}};
    if (w.output) tensors.emplace_back("output", &*w.output);
    const json origin = {{"source", call.source}, {"call_index", call.call_index}, {"op", call.op}, {"backend", call.backend},
                         {"metadata", call.metadata}};
    write_safetensors((root_ / blob_relative).string(), tensors, {{"producer", producer_}, {"attnreplay.call", origin.dump()}});
    const json line = {{"definition", w.definition_name},
                       {"workload", {{"uuid", uuid}, {"axes", w.axes}, {"inputs", inputs}}},
                       {"solution", nullptr},
                       {"evaluation", nullptr}};
    std::ofstream out(workloads, std::ios::app);
    out << line.dump() << '\n';
    if (!out.flush()) throw_input_error(workloads.string(), "write failed");
    known_uuids(workloads).insert(uuid);
  }
  void close() override {}

 private:
  void write_definition(const Workload& w) {
    const fs::path path = root_ / "definitions" / w.op_type / (w.definition_name + ".json");
    if (written_definitions_.count(path.string())) return;
    std::error_code error;
    if (fs::exists(path, error)) {
      json existing;
      try {
        existing = json::parse(std::ifstream(path));
      } catch (const json::exception& e) {
        throw_input_error(path.string(), "not JSON: {}", e.what());
      }
      const json ours = json::parse(w.definition.dump());
      if (existing.value("inputs", json()) != ours["inputs"] || existing.value("axes", json()) != ours["axes"]) {
        throw_input_error(path.string(), "a definition of this name is already there with other inputs or axes; write into "
                                         "another folder");
      }
    } else {
      fs::create_directories(path.parent_path(), error);
      std::ofstream out(path);
      out << w.definition.dump(2) << '\n';
      if (!out.flush()) throw_input_error(path.string(), "write failed");
    }
    written_definitions_.insert(path.string());
  }

  std::set<std::string>& known_uuids(const fs::path& workloads) {
    auto [it, fresh] = uuids_.try_emplace(workloads.string());
    if (fresh) {
      std::error_code error;
      fs::create_directories(workloads.parent_path(), error);
      std::ifstream in(workloads);
      for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        try {
          it->second.insert(json::parse(line).at("workload").at("uuid").get<std::string>());
        } catch (const json::exception&) {
        }
      }
    }
    return it->second;
  }

  fs::path root_;
  std::string producer_;
  std::set<std::string> written_definitions_;
  std::map<std::string, std::set<std::string>> uuids_;
};

}  // namespace

std::unique_ptr<CaptureWriter> open_flashinfer_trace_writer(const std::string& folder, const std::string& producer) {
  return std::make_unique<FlashInferTraceWriter>(folder, producer);
}

}  // namespace attnreplay
