#include "formats/pt_format.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>

#include "formats/errors.h"
#include "formats/torch_save.h"
#include "formats/torch_tensor.h"

namespace attnreplay {
namespace fs = std::filesystem;

bool looks_like_zip(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[4] = {};
  return in.read(head, 4) && head[0] == 'P' && head[1] == 'K' && head[2] == 3 && head[3] == 4;
}

void refuse_legacy_torch_save(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (in.get() == 0x80) {  // a pickle's PROTO opcode, where a zip starts "PK"
    throw_input_error(path, "a legacy (pre-1.6, non-zip) torch.save file; re-save it with torch.save's default format");
  }
}

namespace {

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw_input_error(path, "cannot open for reading");
  std::vector<char> bytes(static_cast<std::size_t>(in.tellg()));
  in.seekg(0);
  if (!in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()))) throw_input_error(path, "cannot read");
  return bytes;
}

// A .pt file's object, its tensors read as asked. TorchSaveArchive reads it where it can: the
// pickle at open, a tensor's bytes when wanted. A pickle beyond it (objects other than containers,
// numbers, strings and tensors) is read by torch's own reader, every byte, at open.
class PtObject {
 public:
  explicit PtObject(const std::string& path) {
    if (!looks_like_zip(path)) {
      refuse_legacy_torch_save(path);
      throw_input_error(path, "not a .pt file (no zip signature; truncated or another format?)");
    }
    try {
      archive_ = std::make_unique<TorchSaveArchive>(path);
    } catch (const PickleNotUnderstood&) {
      root_ = torch_load(path);
    }
  }
  const c10::IValue& root() const { return archive_ ? archive_->root() : root_; }
  HostTensor host_tensor(const at::Tensor& tensor, bool with_data) const {
    if (archive_) return archive_->host_tensor(tensor, with_data);
    HostTensor host = host_tensor_from_torch(tensor);
    if (!with_data) host.bytes.reset();
    return host;
  }

 private:
  static c10::IValue torch_load(const std::string& path) {
    try {
      return torch::jit::pickle_load(read_file(path));
    } catch (const c10::Error& error) {
      const std::string what = error.what_without_backtrace();
      if (what.find("_rebuild_tensor_v3") != std::string::npos) {
        throw_input_error(path, "holds tensors of a dtype that torch.save pickles with _rebuild_tensor_v3 (fp8, say), "
                                "which libtorch's C++ reader cannot rebuild; save them as bits, x.view(torch.uint8), "
                                "with a 'dtypes' entry naming the dtype (docs/format.md), or write HDF5");
      }
      throw_input_error(path, "cannot be unpickled (truncated, corrupt, or holds objects other than tensors and "
                              "plain containers): {}", what);
    }
  }

  std::unique_ptr<TorchSaveArchive> archive_;
  c10::IValue root_;
};

using Dict = c10::impl::GenericDict;

std::optional<c10::IValue> lookup(const Dict& dict, const std::string& key) {
  auto found = dict.find(key);
  if (found == dict.end()) return std::nullopt;
  return found->value();
}

class CallDictReader {
 public:
  CallDictReader(const Dict& dict, std::string where, const PtObject& object, bool with_data)
      : dict_(dict), where_(std::move(where)), object_(object), with_data_(with_data) {}

  std::optional<c10::IValue> get(const std::string& key) const {
    auto value = lookup(dict_, key);
    if (value && value->isNone()) return std::nullopt;
    return value;
  }
  HostTensor tensor(const std::string& key) const {
    auto value = optional_tensor(key);
    if (!value) throw_input_error(where_, "field '{}': missing", key);
    return *value;
  }
  std::optional<HostTensor> optional_tensor(const std::string& key) const {
    auto value = get(key);
    if (!value) return std::nullopt;
    if (!value->isTensor()) throw_input_error(where_, "field '{}': expected a tensor, got {}", key, value->tagKind());
    HostTensor tensor = object_.host_tensor(value->toTensor(), with_data_);
    // Element types Python's torch.load cannot rebuild from a C++ pickle (fp8) travel as their
    // bits in uint8, with the real dtype under 'dtypes'.
    if (auto declared = declared_dtype(key); declared && *declared != tensor.dtype) {
      if (tensor.dtype != DType::uint8 || dtype_size(*declared) != 1) {
        throw_input_error(where_, "field 'dtypes': says '{}' is {}, but it holds {}", key, dtype_name(*declared),
                          dtype_name(tensor.dtype));
      }
      tensor.dtype = *declared;
    }
    return tensor;
  }
  std::optional<DType> declared_dtype(const std::string& key) const {
    auto dtypes = get("dtypes");
    if (!dtypes || !dtypes->isGenericDict()) return std::nullopt;
    auto entry = lookup(dtypes->toGenericDict(), key);
    if (!entry || !entry->isString()) return std::nullopt;
    auto dtype = parse_dtype(entry->toStringRef());
    if (!dtype) throw_input_error(where_, "field 'dtypes': unknown dtype '{}' for '{}'", entry->toStringRef(), key);
    return dtype;
  }
  std::optional<double> number(const std::string& key) const {
    auto value = get(key);
    if (!value) return std::nullopt;
    if (value->isDouble()) return value->toDouble();
    if (value->isInt()) return static_cast<double>(value->toInt());
    if (value->isBool()) return value->toBool() ? 1.0 : 0.0;
    throw_input_error(where_, "field '{}': expected a number, got {}", key, value->tagKind());
  }
  std::optional<bool> flag(const std::string& key) const {
    auto value = get(key);
    if (!value) return std::nullopt;
    if (value->isBool()) return value->toBool();
    if (value->isInt()) return value->toInt() != 0;
    throw_input_error(where_, "field '{}': expected a bool, got {}", key, value->tagKind());
  }
  std::optional<std::string> text(const std::string& key) const {
    auto value = get(key);
    if (!value) return std::nullopt;
    if (value->isString()) return value->toStringRef();
    throw_input_error(where_, "field '{}': expected a string, got {}", key, value->tagKind());
  }
  std::optional<Dict> dict(const std::string& key) const {
    auto value = get(key);
    if (!value) return std::nullopt;
    if (!value->isGenericDict()) throw_input_error(where_, "field '{}': expected a dict, got {}", key, value->tagKind());
    return value->toGenericDict();
  }
  bool has(const std::string& key) const { return get(key).has_value(); }
  const std::string& where() const { return where_; }

 private:
  const Dict& dict_;
  std::string where_;
  const PtObject& object_;
  bool with_data_;
};

void check_declared_shape(const CallDictReader& reader, const std::string& key, const HostTensor& tensor) {
  auto declared = reader.get(key);
  if (!declared) return;
  std::vector<std::int64_t> dims;
  if (declared->isIntList()) dims = declared->toIntVector();
  else if (declared->isTuple()) {
    for (const auto& element : declared->toTupleRef().elements()) {
      if (!element.isInt()) throw_input_error(reader.where(), "field '{}': expected integers", key);
      dims.push_back(element.toInt());
    }
  } else if (declared->isList()) {
    for (const auto& element : declared->toListRef()) {
      if (!element.isInt()) throw_input_error(reader.where(), "field '{}': expected integers", key);
      dims.push_back(element.toInt());
    }
  } else {
    return;  // torch.Size pickles as a tuple; anything else carries no shape we can check
  }
  if (dims != tensor.shape) {
    throw_input_error(reader.where(), "field '{}': says {}, but the tensor is {}", key, shape_string(dims),
                      shape_string(tensor.shape));
  }
}

// Fills `call` from a dict in any of the understood forms. `position` numbers calls that carry
// no index of their own.
AttentionCall call_from_dict(const Dict& dict, const std::string& path, std::int64_t position, const PtObject& object,
                             bool with_data) {
  AttentionCall call;
  call.source = path;
  call.call_index = position;
  CallDictReader probe(dict, call.where(), object, with_data);
  if (auto index = probe.number("call_index")) call.call_index = static_cast<std::int64_t>(*index);
  else if (auto aiter_index = probe.number("call_idx")) call.call_index = static_cast<std::int64_t>(*aiter_index);
  CallDictReader reader(dict, call.where(), object, with_data);

  const auto format = reader.text("format");
  if (format && *format != kPtSchemaName) {
    throw_input_error(reader.where(), "field 'format': expected '{}', got '{}'", kPtSchemaName, *format);
  }
  if (format) {
    const auto version = reader.number("schema_version").value_or(0);
    if (version < 1 || version > kPtSchemaVersion) {
      throw_input_error(reader.where(), "field 'schema_version': {} is not readable by this build (reads 1..{})",
                        version, kPtSchemaVersion);
    }
  }
  const bool long_names = !reader.has("q") && reader.has("query");
  call.q = reader.tensor(long_names ? "query" : "q");
  call.k = reader.tensor(long_names ? "key" : "k");
  call.v = reader.tensor(long_names ? "value" : "v");
  check_declared_shape(reader, "q_shape", call.q);
  check_declared_shape(reader, "k_shape", call.k);
  check_declared_shape(reader, "v_shape", call.v);
  if (auto declared_dtype = reader.text("dtype")) {
    auto dtype = parse_dtype(*declared_dtype);
    if (!dtype) throw_input_error(reader.where(), "field 'dtype': unknown dtype '{}'", *declared_dtype);
    if (*dtype != call.q.dtype) {
      throw_input_error(reader.where(), "field 'dtype': says {}, but q is {}", *declared_dtype, dtype_name(call.q.dtype));
    }
  }
  call.mask = reader.optional_tensor(reader.has("attn_mask") ? "attn_mask" : "mask");
  call.out = reader.optional_tensor(reader.has("output") ? "output" : "out");
  call.alibi_slopes = reader.optional_tensor("alibi_slopes");
  call.sinks = reader.optional_tensor("sinks");
  call.cu_seqlens_q = reader.optional_tensor("cu_seqlens_q");
  call.cu_seqlens_k = reader.optional_tensor("cu_seqlens_k");
  call.seqused_k = reader.optional_tensor("seqused_k");
  call.block_table = reader.optional_tensor("block_table");
  call.op = reader.text("op").value_or(format ? "" : "unknown");
  call.backend = reader.text("backend").value_or("");
  if (auto layout_text = reader.text("layout")) {
    auto layout = parse_layout(*layout_text);
    if (!layout) throw_input_error(reader.where(), "field 'layout': expected bhsd, bshd or thd, got '{}'", *layout_text);
    call.layout = *layout;
  }
  if (auto alignment_text = reader.text("causal_alignment")) {
    auto alignment = parse_causal_alignment(*alignment_text);
    if (!alignment) throw_input_error(reader.where(), "field 'causal_alignment': unknown '{}'", *alignment_text);
    call.causal_alignment = *alignment;
  }
  // aiter keeps the caller's keyword arguments under 'kwargs'; plain dicts may have them at top level.
  auto apply_arguments = [&call](const CallDictReader& arguments) {
    if (auto causal = arguments.flag("is_causal")) call.is_causal = *causal;
    if (auto causal = arguments.flag("causal")) call.is_causal = *causal;
    if (auto scale = arguments.number("scale")) call.scale = *scale;
    if (auto scale = arguments.number("softmax_scale")) call.scale = *scale;
    if (auto dropout = arguments.number("dropout_p")) call.dropout_p = *dropout;
    if (auto gqa = arguments.flag("enable_gqa")) call.enable_gqa = *gqa;
    // None or -1: unbounded, as flash-attn spells it.
    if (auto left = arguments.number("window_left"); left && *left >= 0) call.window_left = static_cast<std::int64_t>(*left);
    if (auto right = arguments.number("window_right"); right && *right >= 0) {
      call.window_right = static_cast<std::int64_t>(*right);
    }
    if (auto softcap = arguments.number("softcap")) call.softcap = *softcap;
  };
  apply_arguments(reader);
  if (auto kwargs = reader.dict("kwargs")) {
    CallDictReader arguments(*kwargs, reader.where() + ": field 'kwargs'", object, with_data);
    apply_arguments(arguments);
    if (!call.mask) call.mask = arguments.optional_tensor("attn_mask");
    for (const auto& entry : *kwargs) {
      const auto& value = entry.value();
      if (value.isString()) call.metadata["kwargs." + entry.key().toStringRef()] = value.toStringRef();
    }
  }
  if (auto metadata = reader.dict("metadata")) {
    for (const auto& entry : *metadata) {
      if (!entry.key().isString()) continue;
      const auto& value = entry.value();
      call.metadata[entry.key().toStringRef()] =
          value.isString() ? value.toStringRef() : (value.isInt() ? std::to_string(value.toInt()) : "");
    }
  }
  if (auto devices = reader.dict("devices")) {
    for (const auto& entry : *devices) {
      if (!entry.value().isString()) continue;
      const std::string& name = entry.key().toStringRef();
      for (auto& [field, tensor] : call.named_tensors()) {
        if (field == name) tensor->device = entry.value().toStringRef();
      }
    }
  }
  call.shape();
  return call;
}

Dict dict_of(const c10::IValue& value, const std::string& where) {
  if (!value.isGenericDict()) throw_input_error(where, "expected a dict, got {}", value.tagKind());
  return value.toGenericDict();
}

// A single .pt file: one call, or {"calls": [...]}. Parsed once at open; calls convert lazily.
class PtFileSource final : public CaptureSource {
 public:
  explicit PtFileSource(std::string path) : path_(std::move(path)), object_(path_) {
    const c10::IValue& root = object_.root();
    Dict dict = dict_of(root, path_);
    if (auto calls = lookup(dict, "calls")) {
      if (!calls->isList()) throw_input_error(path_, "field 'calls': expected a list, got {}", calls->tagKind());
      for (const auto& element : calls->toListRef()) entries_.push_back(element);
    } else {
      entries_.push_back(root);
    }
    // Order by the calls' own indices.
    std::vector<std::pair<std::int64_t, std::size_t>> order;
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      std::int64_t index = static_cast<std::int64_t>(i);
      if (entries_[i].isGenericDict()) {
        Dict entry = entries_[i].toGenericDict();
        for (const char* key : {"call_index", "call_idx"}) {
          auto value = lookup(entry, key);
          if (value && value->isInt()) index = value->toInt();
        }
      }
      order.emplace_back(index, i);
    }
    std::stable_sort(order.begin(), order.end());
    for (const auto& [index, position] : order) order_.push_back(position);
  }

  const std::string& path() const override { return path_; }
  std::string format() const override { return "pt"; }
  std::size_t size() const override { return entries_.size(); }
  const std::vector<std::string>& open_errors() const override { return open_errors_; }
  AttentionCall load(std::size_t position, bool with_data) override {
    const std::size_t entry = order_.at(position);
    const std::string where = fmt::format("{}: call {}", path_, entry);
    return call_from_dict(dict_of(entries_[entry], where), path_, static_cast<std::int64_t>(entry), object_, with_data);
  }

 private:
  std::string path_;
  PtObject object_;
  std::vector<c10::IValue> entries_;
  std::vector<std::size_t> order_;
  std::vector<std::string> open_errors_;
};

// A folder of one-call .pt files (aiter's <kernel>_input_<n>.pt, or ours). The first pass reads
// every file's pickle (not its tensors) for its call index, because file names do not order calls
// reliably.
class PtFolderSource final : public CaptureSource {
 public:
  explicit PtFolderSource(std::string path) : path_(std::move(path)) {
    static const std::regex metadata_name(R"(.*_metadata\.pt)");
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(path_)) {
      const std::string name = entry.path().filename().string();
      if (!entry.is_regular_file() || entry.path().extension() != ".pt") continue;
      if (std::regex_match(name, metadata_name)) continue;  // aiter's summary, not a call
      files.push_back(entry.path().string());
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) throw_input_error(path_, "no .pt call files in this folder");
    std::vector<std::tuple<std::int64_t, std::string>> indexed;
    for (const std::string& file : files) {
      try {
        const PtObject object(file);
        Dict dict = dict_of(object.root(), file);
        std::int64_t index = static_cast<std::int64_t>(indexed.size());
        for (const char* key : {"call_index", "call_idx"}) {
          auto value = lookup(dict, key);
          if (value && value->isInt()) index = value->toInt();
        }
        indexed.emplace_back(index, file);
      } catch (const InputError& error) {
        open_errors_.push_back(error.what());
      }
    }
    std::stable_sort(indexed.begin(), indexed.end());
    for (const auto& [index, file] : indexed) files_.push_back(file);
    if (files_.empty() && !open_errors_.empty()) throw_input_error(path_, "no readable call file: {}", open_errors_.front());
  }

  const std::string& path() const override { return path_; }
  std::string format() const override { return "pt-folder"; }
  std::size_t size() const override { return files_.size(); }
  const std::vector<std::string>& open_errors() const override { return open_errors_; }
  AttentionCall load(std::size_t position, bool with_data) override {
    const std::string& file = files_.at(position);
    const PtObject object(file);
    AttentionCall call = call_from_dict(dict_of(object.root(), file), file, static_cast<std::int64_t>(position), object,
                                        with_data);
    // aiter names files <kernel>_input_<n>.pt and records no op: the kernel name is the best we have.
    const std::string name = fs::path(file).filename().string();
    if ((call.op.empty() || call.op == "unknown") && name.find("_input_") != std::string::npos) {
      call.op = name.substr(0, name.find("_input_"));
    }
    return call;
  }

 private:
  std::string path_;
  std::vector<std::string> files_;
  std::vector<std::string> open_errors_;
};

// A tensor as Python's torch.load can rebuild it: fp8 as its bits in uint8 (declared in 'dtypes').
at::Tensor loadable_tensor(const HostTensor& tensor) {
  at::Tensor t = torch_from_host_tensor(tensor);
  if (tensor.dtype == DType::float8_e4m3fn || tensor.dtype == DType::float8_e5m2) t = t.view(at::kByte);
  return t;
}

c10::IValue optional_tensor_value(const std::optional<HostTensor>& tensor) {
  return tensor ? c10::IValue(loadable_tensor(*tensor)) : c10::IValue();
}

Dict string_dict() { return Dict(c10::StringType::get(), c10::AnyType::get()); }

c10::IValue call_to_dict(const AttentionCall& call) {
  Dict dict = string_dict();
  dict.insert("format", std::string(kPtSchemaName));
  dict.insert("schema_version", kPtSchemaVersion);
  dict.insert("call_index", call.call_index);
  dict.insert("op", call.op);
  dict.insert("backend", call.backend);
  dict.insert("layout", std::string(layout_name(call.layout)));
  dict.insert("is_causal", call.is_causal);
  dict.insert("causal_alignment", std::string(causal_alignment_name(call.causal_alignment)));
  dict.insert("scale", call.scale ? c10::IValue(*call.scale) : c10::IValue());
  dict.insert("dropout_p", call.dropout_p);
  dict.insert("enable_gqa", call.enable_gqa);
  dict.insert("window_left", call.window_left ? c10::IValue(*call.window_left) : c10::IValue());
  dict.insert("window_right", call.window_right ? c10::IValue(*call.window_right) : c10::IValue());
  dict.insert("softcap", call.softcap);
  dict.insert("q", loadable_tensor(call.q));
  dict.insert("k", loadable_tensor(call.k));
  dict.insert("v", loadable_tensor(call.v));
  dict.insert("mask", optional_tensor_value(call.mask));
  dict.insert("out", optional_tensor_value(call.out));
  dict.insert("alibi_slopes", optional_tensor_value(call.alibi_slopes));
  dict.insert("sinks", optional_tensor_value(call.sinks));
  dict.insert("cu_seqlens_q", optional_tensor_value(call.cu_seqlens_q));
  dict.insert("cu_seqlens_k", optional_tensor_value(call.cu_seqlens_k));
  dict.insert("seqused_k", optional_tensor_value(call.seqused_k));
  dict.insert("block_table", optional_tensor_value(call.block_table));
  Dict devices = string_dict(), dtypes = string_dict();
  for (const auto& [name, tensor] : call.named_tensors()) {
    devices.insert(std::string(name), tensor->device);
    dtypes.insert(std::string(name), std::string(dtype_name(tensor->dtype)));
  }
  dict.insert("devices", devices);
  dict.insert("dtypes", dtypes);
  Dict metadata = string_dict();
  for (const auto& [key, value] : call.metadata) metadata.insert(key, value);
  dict.insert("metadata", metadata);
  return dict;
}

// torch.save's zip layout, pickled without TorchScript's type tags (restore_type_tag), which
// Python's torch.load(weights_only=True) refuses.
std::vector<char> save_for_python(const c10::IValue& value) {
  std::vector<char> pickle_bytes;
  torch::jit::Pickler pickler([&](const char* data, size_t size) { pickle_bytes.insert(pickle_bytes.end(), data, data + size); },
                              nullptr, nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    const auto* bytes = static_cast<const char*>(data);
    archive.insert(archive.end(), bytes, bytes + size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickle_bytes.data(), pickle_bytes.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return archive;
}

void write_bytes(const std::vector<char>& bytes, const std::string& path) {
  // Write beside the target and rename, so a reader never sees half a file.
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) throw_input_error(path, "cannot open for writing");
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out.flush()) throw_input_error(path, "write failed (disk full?)");
  }
  std::error_code error;
  fs::rename(partial, path, error);
  if (error) throw_input_error(path, "cannot rename into place: {}", error.message());
}

}  // namespace

std::unique_ptr<CaptureSource> open_pt_file(const std::string& path) { return std::make_unique<PtFileSource>(path); }
std::unique_ptr<CaptureSource> open_pt_folder(const std::string& path) { return std::make_unique<PtFolderSource>(path); }

void write_pt_call(const AttentionCall& call, const std::string& path) {
  write_bytes(save_for_python(call_to_dict(call)), path);
}

void write_pt_calls(const std::vector<AttentionCall>& calls, const std::string& path) {
  Dict root = string_dict();
  root.insert("format", std::string("attnreplay.capture"));
  root.insert("schema_version", kPtSchemaVersion);
  c10::impl::GenericList list(c10::AnyType::get());
  for (const AttentionCall& call : calls) list.push_back(call_to_dict(call));
  root.insert("calls", list);
  write_bytes(save_for_python(root), path);
}

void write_pt_tensors(const std::vector<std::pair<std::string, HostTensor>>& tensors,
                      const std::vector<std::pair<std::string, std::string>>& strings, const std::string& path) {
  Dict root = string_dict();
  Dict dtypes = string_dict();
  for (const auto& [key, tensor] : tensors) {
    root.insert(key, loadable_tensor(tensor));
    dtypes.insert(key, std::string(dtype_name(tensor.dtype)));
  }
  root.insert("dtypes", dtypes);
  for (const auto& [key, value] : strings) root.insert(key, value);
  write_bytes(save_for_python(root), path);
}

}  // namespace attnreplay
