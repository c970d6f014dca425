// FlashInfer-Trace in: a folder of definitions and workloads as calls, and fi_trace dumps
// (formats/flashinfer_trace.h); the writing is in flashinfer_trace_writer.cpp.
#include "formats/flashinfer_trace.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "formats/content_hash.h"
#include "formats/errors.h"
#include "formats/safetensors_format.h"

namespace attnreplay {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using Shape = std::vector<std::int64_t>;

// What attnreplay needs of an attention definition.
struct DefinitionInfo {
  json definition;
  std::string path;
  FlashInferDefinitionShape shape;
  bool mla() const { return shape.op_type == "mla_paged"; }
};

std::int64_t const_value(const json& axes, const char* name, const std::string& where) {
  const auto axis = axes.find(name);
  if (axis == axes.end() || axis->value("type", "") != "const" || !axis->contains("value")) {
    throw_input_error(where, "axes.{}: expected a constant axis with a value", name);
  }
  return axis->at("value").get<std::int64_t>();
}

std::optional<DefinitionInfo> attention_definition(const json& definition, const std::string& path) {
  const std::string op_type = definition.value("op_type", "");
  const std::string name = definition.value("name", "");
  if (op_type != "gqa_ragged" && op_type != "gqa_paged" && op_type != "mla_paged") return std::nullopt;
  DefinitionInfo info{definition, path, {}};
  FlashInferDefinitionShape& s = info.shape;
  s.name = name;
  s.op_type = op_type;
  const json axes = definition.value("axes", json::object());
  try {
    const bool decode = name.find("_decode") != std::string::npos;
    s.kind = op_type == "gqa_ragged" ? FlashInferDefinitionShape::Kind::ragged_prefill
             : decode                ? FlashInferDefinitionShape::Kind::paged_decode
                                     : FlashInferDefinitionShape::Kind::paged_prefill;
    s.causal = name.find("_causal") != std::string::npos;
    s.heads_q = const_value(axes, "num_qo_heads", path);
    if (info.mla()) {
      s.heads_kv = 1;
      s.head_dim_vo = const_value(axes, "head_dim_ckv", path);
      s.head_dim_qk = s.head_dim_vo + const_value(axes, "head_dim_kpe", path);
    } else {
      s.heads_kv = const_value(axes, "num_kv_heads", path);
      s.head_dim_qk = s.head_dim_vo = const_value(axes, "head_dim", path);
    }
    if (op_type != "gqa_ragged") s.page_size = const_value(axes, "page_size", path);
    const std::string q_name = info.mla() ? "q_nope" : "q";
    const std::string dtype = definition.at("inputs").at(q_name).at("dtype").get<std::string>();
    const auto parsed = parse_dtype(dtype);
    if (!parsed) throw_input_error(path, "inputs.{}.dtype: '{}' is not a dtype attnreplay reads", q_name, dtype);
    s.dtype = *parsed;
  } catch (const json::exception& e) {
    throw_input_error(path, "{}", e.what());
  }
  if (s.heads_kv <= 0 || s.heads_q % s.heads_kv != 0) {
    throw_input_error(path, "num_kv_heads {} does not divide num_qo_heads {}", s.heads_kv, s.heads_q);
  }
  return info;
}

json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_input_error(path, "cannot open for reading");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw_input_error(path, "not JSON: {}", e.what());
  }
}

class FlashInferTraceSource final : public CaptureSource {
 public:
  explicit FlashInferTraceSource(std::string path) : path_(std::move(path)) {
    const fs::path root(path_);
    std::vector<fs::path> files;
    for (const auto& entry : fs::recursive_directory_iterator(root / "definitions")) {
      if (entry.is_regular_file() && entry.path().extension() == ".json") files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    std::set<std::string> other_definitions;
    for (const auto& file : files) {
      try {
        const json definition = read_json_file(file.string());
        if (auto info = attention_definition(definition, file.string())) definitions_[info->shape.name] = std::move(*info);
        else other_definitions.insert(definition.value("name", file.stem().string()));
      } catch (const InputError& error) {
        open_errors_.push_back(error.what());
      }
    }
    files.clear();
    for (const auto& entry : fs::recursive_directory_iterator(root / "workloads")) {
      if (entry.is_regular_file() && entry.path().extension() == ".jsonl") files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    std::size_t others = 0;
    for (const auto& file : files) {
      std::ifstream in(file);
      std::size_t number = 0;
      for (std::string line; std::getline(in, line);) {
        ++number;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const std::string where = fmt::format("{}: line {}", file.string(), number);
        try {
          json trace = json::parse(line);
          const std::string definition = trace.at("definition").get<std::string>();
          if (other_definitions.count(definition)) {
            ++others;
            continue;
          }
          if (!definitions_.count(definition)) {
            throw_input_error(where, "definition '{}': no definitions/**/{}.json holds it", definition, definition);
          }
          workloads_.push_back({definition, std::move(trace.at("workload")), where});
        } catch (const json::exception& e) {
          open_errors_.push_back(fmt::format("{}: not a workload: {}", where, e.what()));
        } catch (const InputError& error) {
          open_errors_.push_back(error.what());
        }
      }
    }
    format_ = fmt::format("FlashInfer-Trace ({} workloads of {} attention definitions{})", workloads_.size(), definitions_.size(),
                          others ? fmt::format("; {} workloads of other operations not read", others) : "");
  }

  const std::string& path() const override { return path_; }
  std::string format() const override { return format_; }
  std::size_t size() const override { return workloads_.size(); }
  const std::vector<std::string>& open_errors() const override { return open_errors_; }

  AttentionCall load(std::size_t position, bool with_data) override {
    const WorkloadLine& line = workloads_.at(position);
    if (blobs_.size() > kOpenBlobs) blobs_.clear();  // workloads are read in order: a blob is rarely read again
    const DefinitionInfo& info = definitions_.at(line.definition);
    const FlashInferDefinitionShape& d = info.shape;
    const std::string where = fmt::format("{} (workload {})", line.where, line.workload.value("uuid", "?"));
    Inputs in(*this, info, line.workload, where, with_data);
    AttentionCall call;
    call.source = path_;
    call.call_index = static_cast<std::int64_t>(position);
    call.op = d.name;
    call.layout = Layout::thd;
    call.is_causal = d.causal;
    call.causal_alignment = CausalAlignment::bottom_right;
    call.scale = in.scalar("sm_scale");
    const bool decode = d.kind == FlashInferDefinitionShape::Kind::paged_decode;
    if (info.mla()) {
      HostTensor q_nope = in.tensor("q_nope"), q_pe = in.tensor("q_pe"), ckv = in.tensor("ckv_cache"), kpe = in.tensor("kpe_cache");
      call.q = with_data ? last_dim_concat(q_nope, q_pe) : q_nope;
      call.q.shape.back() = d.head_dim_qk;
      call.k = with_data ? last_dim_concat(ckv, kpe) : ckv;
      call.k.shape = {ckv.shape[0], ckv.shape[1], 1, d.head_dim_qk};
      call.v = with_shape(ckv, {ckv.shape[0], ckv.shape[1], 1, d.head_dim_vo});
    } else {
      call.q = in.tensor("q");
      call.k = in.tensor(d.kind == FlashInferDefinitionShape::Kind::ragged_prefill ? "k" : "k_cache");
      call.v = in.tensor(d.kind == FlashInferDefinitionShape::Kind::ragged_prefill ? "v" : "v_cache");
    }
    const std::int64_t rows = call.q.shape[0];
    if (d.kind == FlashInferDefinitionShape::Kind::ragged_prefill) {
      call.cu_seqlens_q = in.tensor("qo_indptr");
      call.cu_seqlens_k = in.tensor("kv_indptr");
    } else {
      HostTensor kv_indptr = in.tensor("kv_indptr"), kv_indices = in.tensor("kv_indices");
      const std::int64_t sequences = kv_indptr.shape[0] - 1;
      if (decode) {
        std::vector<std::int64_t> one_each(static_cast<std::size_t>(rows + 1));
        std::iota(one_each.begin(), one_each.end(), std::int64_t{0});
        call.cu_seqlens_q = int32_tensor(one_each);
      } else {
        call.cu_seqlens_q = in.tensor("qo_indptr");
      }
      std::optional<HostTensor> last_page_len;
      if (info.definition.at("inputs").contains("kv_last_page_len")) last_page_len = in.tensor("kv_last_page_len");
      else if (d.page_size != 1) {
        throw_input_error(info.path, "page_size {} without a kv_last_page_len input: how much of each last page is used is "
                                     "not said",
                          d.page_size);
      }
      if (with_data) paged_table(call, kv_indptr, kv_indices, last_page_len, d.page_size, where);
      else {
        call.block_table = HostTensor{DType::int32, {sequences, 1}};
        call.seqused_k = HostTensor{DType::int32, {sequences}};
      }
    }
    if (const auto output = in.stored_output()) call.out = *output;
    if (const auto origin = in.origin()) {
      call.backend = origin->value("backend", "");
      call.metadata = origin->value("metadata", std::map<std::string, std::string>());
      call.metadata["capture.op"] = origin->value("op", "");
      call.metadata["capture.source"] = origin->value("source", "");
      call.metadata["capture.call_index"] = std::to_string(origin->value("call_index", std::int64_t{0}));
    }
    call.metadata[kFlashInferDefinitionKey] = d.name;
    call.metadata[kFlashInferWorkloadKey] = line.workload.dump();
    call.shape();
    if (with_data) call.sequences();  // checks the indptrs against the tensors, naming the field
    return call;
  }

 private:
  struct WorkloadLine {
    std::string definition;
    json workload;
    std::string where;
  };

  // The inputs of one workload, checked against the definition's shapes and dtypes.
  class Inputs {
   public:
    Inputs(FlashInferTraceSource& source, const DefinitionInfo& info, const json& workload, std::string where, bool with_data)
        : source_(source), info_(info), workload_(workload), where_(std::move(where)), with_data_(with_data) {
      for (const auto& [name, axis] : info.definition.at("axes").items()) {
        if (axis.value("type", "") == "const") axes_[name] = axis.at("value").get<std::int64_t>();
      }
      const json axes = workload.value("axes", json::object());
      try {
        for (const auto& [name, value] : axes.items()) axes_[name] = value.get<std::int64_t>();
      } catch (const json::exception& e) {
        throw_input_error(where_, "axes: {}", e.what());
      }
    }

    double scalar(const std::string& name) const {
      const json& spec = input_spec(name);
      if (spec.value("type", "") != "scalar") throw_input_error(where_, "input '{}': expected a scalar", name);
      return spec.at("value").get<double>();
    }

    HostTensor tensor(const std::string& name) {
      const json& spec = input_spec(name);
      const json& declared = info_.definition.at("inputs").at(name);
      Shape shape;
      for (const auto& axis : declared.at("shape")) {
        const auto value = axes_.find(axis.get<std::string>());
        if (value == axes_.end()) throw_input_error(where_, "axes: no value for '{}', which input '{}' uses", axis.get<std::string>(), name);
        shape.push_back(value->second);
      }
      const auto dtype = parse_dtype(declared.at("dtype").get<std::string>());
      if (!dtype) throw_input_error(info_.path, "inputs.{}.dtype: '{}' is not a dtype attnreplay reads", name, declared.at("dtype").get<std::string>());
      const std::string type = spec.value("type", "");
      if (type == "random") {
        if (!dtype_is_floating(*dtype)) {
          throw_input_error(where_, "input '{}' is random, but it says where sequences and pages lie: a workload needs its values", name);
        }
        HostTensor tensor{*dtype, shape};
        if (!with_data_) return tensor;
        // Standard normal values from a seed of the workload's uuid and the input's name, as generated calls are.
        const std::string seed_text = workload_.value("uuid", "") + "/" + name;
        std::mt19937_64 generator(content_hash(seed_text.data(), seed_text.size()));
        std::normal_distribution<double> normal;
        std::vector<double> values(static_cast<std::size_t>(tensor.numel()));
        for (double& value : values) value = normal(generator);
        return HostTensor::from_doubles(*dtype, shape, values);
      }
      if (type != "safetensors") throw_input_error(where_, "input '{}': type '{}', expected safetensors or random", name, type);
      SafetensorsFile& file = source_.blob(spec.at("path").get<std::string>(), where_);
      const std::string key = spec.at("tensor_key").get<std::string>();
      if (!file.tensors().count(key)) throw_input_error(where_, "input '{}': {} holds no tensor '{}'", name, file.path(), key);
      const auto& found = file.tensors().at(key);
      if (found.shape != shape || found.dtype != *dtype) {
        throw_input_error(where_, "input '{}': {}'s '{}' is {} {}, the definition and axes say {} {}", name, file.path(), key,
                          dtype_name(found.dtype), shape_string(found.shape), dtype_name(*dtype), shape_string(shape));
      }
      if (!q_file_) q_file_ = &file;
      return file.tensor(key, with_data_);
    }

    // The model's output, where attnreplay stored it beside q ("output", rows as q's).
    std::optional<HostTensor> stored_output() {
      if (!q_file_ || !q_file_->tensors().count("output")) return std::nullopt;
      return q_file_->tensor("output", with_data_);
    }
    std::optional<json> origin() const {
      if (!q_file_) return std::nullopt;
      const auto found = q_file_->metadata().find("attnreplay.call");
      if (found == q_file_->metadata().end()) return std::nullopt;
      try {
        return json::parse(found->second);
      } catch (const json::exception&) {
        return std::nullopt;
      }
    }

   private:
    const json& input_spec(const std::string& name) const {
      if (!workload_.contains("inputs") || !workload_.at("inputs").contains(name)) {
        throw_input_error(where_, "inputs: no '{}', which definition {} takes", name, info_.shape.name);
      }
      return workload_.at("inputs").at(name);
    }
    FlashInferTraceSource& source_;
    const DefinitionInfo& info_;
    const json& workload_;
    std::string where_;
    bool with_data_;
    std::map<std::string, std::int64_t> axes_;
    SafetensorsFile* q_file_ = nullptr;
  };

  static void paged_table(AttentionCall& call, const HostTensor& kv_indptr, const HostTensor& kv_indices,
                          const std::optional<HostTensor>& last_page_len, std::int64_t page_size, const std::string& where) {
    const std::vector<std::int64_t> indptr = kv_indptr.to_integers(), indices = kv_indices.to_integers();
    const std::int64_t sequences = static_cast<std::int64_t>(indptr.size()) - 1;
    std::int64_t width = 1;
    for (std::int64_t b = 0; b < sequences; ++b) {
      if (indptr[b + 1] < indptr[b] || indptr[b + 1] > static_cast<std::int64_t>(indices.size())) {
        throw_input_error(where, "kv_indptr: sequence {} spans [{}, {}), outside kv_indices' {}", b, indptr[b], indptr[b + 1], indices.size());
      }
      width = std::max(width, indptr[b + 1] - indptr[b]);
    }
    std::vector<std::int64_t> table(static_cast<std::size_t>(sequences * width), 0), used(static_cast<std::size_t>(sequences));
    const std::vector<std::int64_t> last = last_page_len ? last_page_len->to_integers() : std::vector<std::int64_t>();
    for (std::int64_t b = 0; b < sequences; ++b) {
      const std::int64_t pages = indptr[b + 1] - indptr[b];
      for (std::int64_t j = 0; j < pages; ++j) table[static_cast<std::size_t>(b * width + j)] = indices[static_cast<std::size_t>(indptr[b] + j)];
      used[static_cast<std::size_t>(b)] = pages == 0 ? 0 : last.empty() ? pages * page_size : (pages - 1) * page_size + last[static_cast<std::size_t>(b)];
    }
    HostTensor block_table = int32_tensor(table);
    block_table.shape = {sequences, width};
    call.block_table = std::move(block_table);
    call.seqused_k = int32_tensor(used);
  }

  SafetensorsFile& blob(const std::string& relative, const std::string& where) {
    const fs::path path = fs::path(relative).is_absolute() ? fs::path(relative) : fs::path(path_) / relative;
    auto found = blobs_.find(path.string());
    if (found == blobs_.end()) {
      std::error_code error;
      if (!fs::exists(path, error)) throw_input_error(where, "input file {} does not exist", path.string());
      found = blobs_.emplace(path.string(), SafetensorsFile(path.string())).first;
    }
    return found->second;
  }

  static constexpr std::size_t kOpenBlobs = 64;
  std::string path_, format_;
  std::map<std::string, DefinitionInfo> definitions_;
  std::vector<WorkloadLine> workloads_;
  std::vector<std::string> open_errors_;
  std::map<std::string, SafetensorsFile> blobs_;
};

}  // namespace

bool looks_like_flashinfer_trace(const std::string& path) {
  std::error_code error;
  return fs::is_directory(fs::path(path) / "definitions", error) && fs::is_directory(fs::path(path) / "workloads", error);
}

std::unique_ptr<CaptureSource> open_flashinfer_trace(const std::string& path) {
  return std::make_unique<FlashInferTraceSource>(path);
}

std::optional<FlashInferDefinitionShape> read_flashinfer_definition(const std::string& path) {
  const json definition = read_json_file(path);
  if (!definition.is_object() || !definition.contains("op_type") || !definition.contains("axes")) {
    throw_input_error(path, "not a FlashInfer definition: no op_type and axes");
  }
  const auto info = attention_definition(definition, path);
  if (!info) return std::nullopt;
  return info->shape;
}

}  // namespace attnreplay
