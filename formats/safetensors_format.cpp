#include "formats/safetensors_format.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "formats/byte_pool.h"
#include "formats/errors.h"

namespace attnreplay {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kFormat = "attnreplay-safetensors";
constexpr const char* kVersion = "1";
// Headers beyond this are not ours, nor anyone's sane file: the format's own readers cap at 100 MB.
constexpr std::uint64_t kMaxHeader = 100'000'000;

// The format's dtype codes (safetensors' Dtype enum).
constexpr std::pair<DType, const char*> kDtypeCodes[] = {
    {DType::float64, "F64"},      {DType::float32, "F32"},          {DType::float16, "F16"},
    {DType::bfloat16, "BF16"},    {DType::float8_e4m3fn, "F8_E4M3"}, {DType::float8_e5m2, "F8_E5M2"},
    {DType::int64, "I64"},        {DType::int32, "I32"},            {DType::int8, "I8"},
    {DType::uint8, "U8"},         {DType::boolean, "BOOL"}};

const char* dtype_code(DType dtype) {
  for (const auto& [d, code] : kDtypeCodes)
    if (d == dtype) return code;
  return "?";
}

std::optional<DType> parse_dtype_code(const std::string& code) {
  for (const auto& [d, name] : kDtypeCodes)
    if (code == name) return d;
  return std::nullopt;
}

std::uint64_t read_le64(const unsigned char* p) {
  std::uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

}  // namespace

struct SafetensorsFile::Entry {
  DType dtype = DType::float32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // bytes [begin, end) after the header
};

struct SafetensorsFile::Mapping {
  const std::byte* data = nullptr;
  std::size_t size = 0;
  ~Mapping() {
    if (data) munmap(const_cast<std::byte*>(data), size);
  }
};

namespace {

// A header entry, checked against the file's data bytes.
SafetensorsFile::Entry parse_entry(const std::string& path, const std::string& name, const json& entry,
                                   std::uint64_t data_size) {
  const std::string where = fmt::format("{}: tensor '{}'", path, name);
  SafetensorsFile::Entry t;
  try {
    const std::string code = entry.at("dtype").get<std::string>();
    const auto dtype = parse_dtype_code(code);
    if (!dtype) throw_input_error(where, "dtype '{}' is not one attnreplay reads", code);
    t.dtype = *dtype;
    t.shape = entry.at("shape").get<std::vector<std::int64_t>>();
    const auto offsets = entry.at("data_offsets").get<std::vector<std::uint64_t>>();
    if (offsets.size() != 2) throw_input_error(where, "data_offsets: expected [begin, end]");
    t.begin = offsets[0];
    t.end = offsets[1];
  } catch (const json::exception& e) {
    throw_input_error(where, "{}", e.what());
  }
  std::uint64_t numel = 1;
  for (const std::int64_t d : t.shape) {
    if (d < 0) throw_input_error(where, "negative dimension in shape {}", shape_string(t.shape));
    numel *= static_cast<std::uint64_t>(d);
  }
  if (t.begin > t.end || t.end > data_size || t.end - t.begin != numel * dtype_size(t.dtype)) {
    throw_input_error(where, "data_offsets [{}, {}] do not hold {} {} values within the file's {} data bytes", t.begin,
                      t.end, numel, dtype_name(t.dtype), data_size);
  }
  return t;
}

}  // namespace

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  std::ifstream in(path_, std::ios::binary);
  if (!in) throw_input_error(path_, "cannot open for reading");
  unsigned char length[8] = {};
  in.read(reinterpret_cast<char*>(length), 8);
  const std::uint64_t header_size = read_le64(length);
  std::error_code error;
  const std::uint64_t file_size = fs::file_size(path_, error);
  if (in.gcount() != 8 || header_size > kMaxHeader || 8 + header_size > file_size) {
    throw_input_error(path_, "not a safetensors file: its header length does not fit the file");
  }
  data_start_ = 8 + header_size;
  data_size_ = file_size - data_start_;
  std::string text(header_size, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_size));
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    throw_input_error(path_, "safetensors header: not JSON: {}", e.what());
  }
  if (!header.is_object()) throw_input_error(path_, "safetensors header: not a JSON object");
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    entries_[name] = parse_entry(path_, name, entry, data_size_);
  }
  if (const auto metadata = header.find("__metadata__"); metadata != header.end() && metadata->is_object()) {
    for (const auto& [key, value] : metadata->items()) {
      if (!value.is_string()) throw_input_error(path_, "__metadata__.{}: not a string, as the format requires", key);
      metadata_[key] = value.get<std::string>();
    }
  }
  for (const auto& [name, entry] : entries_) tensors_[name] = {entry.dtype, entry.shape};
}

SafetensorsFile::~SafetensorsFile() = default;
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;


HostTensor SafetensorsFile::tensor(const std::string& name, bool with_data) {
  const auto found = entries_.find(name);
  if (found == entries_.end()) throw_input_error(path_, "no tensor '{}'", name);
  const Entry& entry = found->second;
  HostTensor tensor;
  tensor.dtype = entry.dtype;
  tensor.shape = entry.shape;
  if (!with_data) return tensor;
  // Copied out of the file's mapping: the page cache's bytes, no reads through a stream.
  if (!mapping_) {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw_input_error(path_, "cannot open for reading: {}", std::strerror(errno));
    const std::size_t size = static_cast<std::size_t>(data_start_ + data_size_);
    void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) throw_input_error(path_, "cannot map: {}", std::strerror(errno));
    mapping_ = std::make_unique<Mapping>();
    mapping_->data = static_cast<const std::byte*>(map);
    mapping_->size = size;
  }
  auto bytes = allocate_bytes(static_cast<std::size_t>(entry.end - entry.begin));
  std::memcpy(bytes->data(), mapping_->data + data_start_ + entry.begin, bytes->size());
  tensor.bytes = std::move(bytes);
  return tensor;
}

void write_safetensors(const std::string& path, std::span<const std::pair<std::string, const HostTensor*>> tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  std::uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (!tensor->data()) throw_input_error(path, "tensor '{}' has no data to write", name);
    header[name] = {{"dtype", dtype_code(tensor->dtype)}, {"shape", tensor->shape}, {"data_offsets", {offset, offset + tensor->nbytes()}}};
    offset += tensor->nbytes();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // the data starts 8-byte aligned, as the format advises
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) throw_input_error(path, "cannot open for writing");
    unsigned char length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>((text.size() >> (8 * i)) & 0xff);
    out.write(reinterpret_cast<const char*>(length), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& [name, tensor] : tensors) {
      out.write(reinterpret_cast<const char*>(tensor->data()), static_cast<std::streamsize>(tensor->nbytes()));
    }
    if (!out.flush()) throw_input_error(path, "write failed");
  }
  std::error_code error;
  fs::rename(partial, path, error);
  if (error) throw_input_error(path, "cannot move {} into place: {}", partial, error.message());
}

namespace {

// The other arguments of a call, as the header's "calls" array holds them.
json call_arguments(const AttentionCall& call) {
  json tensors = json::object();
  for (const auto& [name, tensor] : call.named_tensors()) {
    tensors[std::string(name)] = {{"strides", tensor->captured_strides}, {"device", tensor->device}};
  }
  return {{"call_index", call.call_index},
          {"op", call.op},
          {"backend", call.backend},
          {"layout", std::string(layout_name(call.layout))},
          {"scale", call.scale ? json(*call.scale) : json()},
          {"is_causal", call.is_causal},
          {"causal_alignment", std::string(causal_alignment_name(call.causal_alignment))},
          {"dropout_p", call.dropout_p},
          {"enable_gqa", call.enable_gqa},
          {"window_left", call.window_left ? json(*call.window_left) : json()},
          {"window_right", call.window_right ? json(*call.window_right) : json()},
          {"softcap", call.softcap},
          {"metadata", call.metadata},
          {"tensors", tensors}};
}

class SafetensorsSource final : public CaptureSource {
 public:
  explicit SafetensorsSource(std::string path) : path_(std::move(path)), file_(path_) {
    const auto& tensors = file_.tensors();
    const auto& metadata = file_.metadata();
    const auto text_at = [&](const char* key) {
      const auto found = metadata.find(key);
      return found == metadata.end() ? std::string() : found->second;
    };
    if (text_at("format") == kFormat) {
      const std::string version = text_at("version");
      if (version != kVersion) throw_input_error(path_, "{} version '{}': this attnreplay reads version {}", kFormat, version, kVersion);
      try {
        calls_ = json::parse(metadata.count("calls") ? metadata.at("calls") : std::string("[]"));
      } catch (const json::exception& e) {
        throw_input_error(path_, "__metadata__.calls: not JSON: {}", e.what());
      }
      if (!calls_.is_array()) throw_input_error(path_, "__metadata__.calls: not a JSON array");
      format_ = fmt::format("{} v{}", kFormat, kVersion);
    } else if (tensors.count("q") && tensors.count("k") && tensors.count("v")) {
      // Plain q, k, v (and mask, out) tensors: one bhsd call with the defaults.
      calls_ = json::array({json{{"call_index", 0}, {"plain", true}}});
      format_ = "safetensors (q, k, v)";
    } else {
      throw_input_error(path_, "a safetensors file without attnreplay's __metadata__ (format '{}') and without tensors "
                               "named q, k and v: not an attention call",
                        kFormat);
    }
  }

  const std::string& path() const override { return path_; }
  std::string format() const override { return format_; }
  std::size_t size() const override { return calls_.size(); }
  const std::vector<std::string>& open_errors() const override { return open_errors_; }

  AttentionCall load(std::size_t position, bool with_data) override {
    const json& record = calls_.at(position);
    const std::string where = fmt::format("{}: call {}", path_, position);
    const bool plain = record.value("plain", false);
    AttentionCall call;
    call.source = path_;
    try {
      call.call_index = record.value("call_index", static_cast<std::int64_t>(position));
      call.op = record.value("op", std::string());
      call.backend = record.value("backend", std::string());
      const std::string layout = record.value("layout", std::string("bhsd"));
      const auto parsed_layout = parse_layout(layout);
      if (!parsed_layout) throw_input_error(where, "field 'layout': unknown layout '{}'", layout);
      call.layout = *parsed_layout;
      if (const auto scale = record.find("scale"); scale != record.end() && !scale->is_null()) call.scale = scale->get<double>();
      call.is_causal = record.value("is_causal", false);
      const std::string alignment = record.value("causal_alignment", std::string("top_left"));
      const auto parsed_alignment = parse_causal_alignment(alignment);
      if (!parsed_alignment) throw_input_error(where, "field 'causal_alignment': unknown '{}'", alignment);
      call.causal_alignment = *parsed_alignment;
      call.dropout_p = record.value("dropout_p", 0.0);
      call.enable_gqa = record.value("enable_gqa", false);
      if (const auto w = record.find("window_left"); w != record.end() && !w->is_null()) call.window_left = w->get<std::int64_t>();
      if (const auto w = record.find("window_right"); w != record.end() && !w->is_null()) call.window_right = w->get<std::int64_t>();
      call.softcap = record.value("softcap", 0.0);
      call.metadata = record.value("metadata", std::map<std::string, std::string>());
    } catch (const json::exception& e) {
      throw_input_error(where, "__metadata__.calls: {}", e.what());
    }
    const json tensors = record.value("tensors", json::object());
    // Call i's tensors are "call<i>.<field>"; a plain file's are the fields themselves.
    const std::string prefix = plain ? "" : fmt::format("call{}.", position);
    for (const auto& [name, entry] : file_.tensors()) {
      if (!name.starts_with(prefix)) continue;
      const std::string field = name.substr(prefix.size());
      HostTensor* slot = call.tensor_field(field);
      if (!slot) throw_input_error(where, "tensor '{}': '{}' is not a field of an attention call", name, field);
      *slot = file_.tensor(name, with_data);
      if (const auto extra = tensors.find(field); extra != tensors.end()) {
        slot->captured_strides = extra->value("strides", std::vector<std::int64_t>());
        slot->device = extra->value("device", std::string("cpu"));
      }
    }
    for (const char* field : {"q", "k", "v"}) {
      if (call.tensor_field(field)->shape.empty()) throw_input_error(where, "field '{}': no tensor '{}{}'", field, prefix, field);
    }
    call.shape();  // checks the dims and names the field that is wrong
    return call;
  }

 private:
  std::string path_, format_;
  SafetensorsFile file_;
  json calls_;
  std::vector<std::string> open_errors_;
};

}  // namespace

bool looks_like_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char head[9] = {};
  in.read(reinterpret_cast<char*>(head), sizeof head);
  if (in.gcount() != 9 || head[8] != '{') return false;
  std::error_code error;
  const std::uint64_t size = fs::file_size(path, error);
  const std::uint64_t header = read_le64(head);
  return !error && header <= kMaxHeader && 8 + header <= size;
}

std::unique_ptr<CaptureSource> open_safetensors_capture(const std::string& path) {
  return std::make_unique<SafetensorsSource>(path);
}

void write_safetensors_calls(std::span<const AttentionCall> calls, const std::string& path, const std::string& producer) {
  json records = json::array();
  std::vector<std::pair<std::string, const HostTensor*>> tensors;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    records.push_back(call_arguments(calls[i]));
    for (const auto& [name, tensor] : calls[i].named_tensors()) {
      if (!tensor->data()) throw_input_error(path, "call {}: field '{}' has no data to write", calls[i].call_index, name);
      tensors.emplace_back(fmt::format("call{}.{}", i, name), tensor);
    }
  }
  write_safetensors(path, tensors, {{"format", kFormat}, {"version", kVersion}, {"producer", producer}, {"calls", records.dump()}});
}

}  // namespace attnreplay
