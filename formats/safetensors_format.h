#pragma once
// Captures as safetensors (Hugging Face's tensor format: an 8-byte little-endian header length, a
// JSON header naming each tensor's dtype, shape and byte range, then the bytes). One file holds
// one or more calls: call i's tensors are named "call<i>.<field>" ("call0.q", "call0.mask"), and
// the header's "__metadata__" holds "format": "attnreplay-safetensors", "version": "1" and "calls":
// every call's other arguments as a JSON array (docs/format.md). A file without that metadata
// whose tensors are named q, k and v (and mask, out) reads as one bhsd call.
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "formats/capture_source.h"

namespace attnreplay {

// One safetensors file: its header read on opening (InputError naming the file and tensor when
// it is damaged), each tensor's bytes copied out of a read-only mapping of the file on demand.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(std::string path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&&) noexcept;
  struct TensorInfo {
    DType dtype = DType::float32;
    std::vector<std::int64_t> shape;
  };
  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }  // "__metadata__"
  // Without data: dtype and shape only. Throws InputError for a name the file does not hold.
  HostTensor tensor(const std::string& name, bool with_data = true);

 struct Entry;  // where a tensor's bytes lie (safetensors_format.cpp)

 private:
  struct Mapping;
  std::string path_;
  std::uint64_t data_start_ = 0, data_size_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  std::unique_ptr<Mapping> mapping_;
};

// Writes `tensors` in the order given, with `metadata` as "__metadata__", whole (through
// `path`.partial, renamed). Throws InputError.
void write_safetensors(const std::string& path, std::span<const std::pair<std::string, const HostTensor*>> tensors,
                       const std::map<std::string, std::string>& metadata);

// By content: a header length that fits the file, then '{'.
bool looks_like_safetensors(const std::string& path);

// Throws InputError naming the file (and the call and field) on a bad header.
std::unique_ptr<CaptureSource> open_safetensors_capture(const std::string& path);

// Writes `calls` as one file, whole (through `path`.partial, renamed). Throws InputError.
void write_safetensors_calls(std::span<const AttentionCall> calls, const std::string& path, const std::string& producer);

}  // namespace attnreplay
