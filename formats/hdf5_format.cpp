#include "formats/hdf5_format.h"

#include <fmt/chrono.h>
#include <hdf5.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "formats/byte_pool.h"
#include "formats/content_hash.h"
#include "formats/errors.h"

namespace attnreplay {
namespace {

constexpr int kMaxRank = 8;
constexpr std::size_t kNameSize = 16;
constexpr std::size_t kOpSize = 128;

// Rows of the two index tables. Field names are the schema (docs/format.md); HDF5 matches
// compound members by name, so readers are immune to member order.
struct TensorRow {
  std::int64_t call_index;
  char name[kNameSize];
  char dtype[kNameSize];
  std::int32_t ndim;
  std::int64_t shape[kMaxRank];
  std::int64_t strides[kMaxRank];
  char device[kNameSize];
  std::int64_t offset;
  std::int64_t numel;
  std::uint64_t content_hash;
};

struct CallRow {
  std::int64_t call_index;
  char op[kOpSize];
  char backend[kOpSize];
  char layout[kNameSize];
  std::uint8_t is_causal;
  char causal_alignment[kNameSize];
  double scale;  // NaN: the default 1/sqrt(head_dim_qk)
  double dropout_p;
  std::uint8_t enable_gqa;
  std::int64_t first_tensor;
  std::int32_t tensor_count;
  std::int64_t metadata_offset;
  std::int64_t metadata_nbytes;
  // Schema v2; v1 files lack them and read as their defaults.
  std::int64_t window_left;   // -1: unbounded
  std::int64_t window_right;  // -1: unbounded
  double softcap;             // 0: none
};

// HDF5 built without its thread-safe option (Debian's and most distributions') must not be
// entered by two threads at once, and replay reads ahead on one thread while --save-inputs writes
// on another: every entry into the library from this file holds this lock.
std::recursive_mutex& hdf5_mutex() {
  static std::recursive_mutex mutex;
  return mutex;
}

// Owns an hid_t and closes it with the matching H5*close.
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, herr_t (*closer)(hid_t)) : id_(id), closer_(closer) {}
  Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, -1)), closer_(other.closer_) {}
  Handle& operator=(Handle&& other) noexcept {
    reset();
    id_ = std::exchange(other.id_, -1);
    closer_ = other.closer_;
    return *this;
  }
  ~Handle() { reset(); }
  void reset() {
    if (id_ >= 0 && closer_) {
      const std::lock_guard lock(hdf5_mutex());
      closer_(id_);
    }
    id_ = -1;
  }
  hid_t get() const { return id_; }
  hid_t release() { return std::exchange(id_, -1); }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_ = -1;
  herr_t (*closer_)(hid_t) = nullptr;
};

herr_t collect_error(unsigned depth, const H5E_error2_t* error, void* out) {
  auto* messages = static_cast<std::vector<std::string>*>(out);
  if (depth < 3 && error->desc && *error->desc) messages->emplace_back(error->desc);
  return 0;
}

// The innermost HDF5 messages, which say what was wrong rather than which API failed.
std::string hdf5_error_text() {
  std::vector<std::string> messages;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_error, &messages);
  H5Eclear2(H5E_DEFAULT);
  if (messages.empty()) return "unknown HDF5 error";
  std::string text = fmt::format("{}", fmt::join(messages, "; "));
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

void silence_hdf5_errors() {
  // HDF5 prints its error stack to stderr by default; we turn failures into our own messages.
  // A thread-safe HDF5 keeps this setting per thread (capture writes from its own thread).
  thread_local bool silenced = false;
  if (!silenced) H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  silenced = true;
}

Handle check(hid_t id, herr_t (*closer)(hid_t), const std::string& where, std::string_view what) {
  if (id < 0) throw_input_error(where, "{}: {}", what, hdf5_error_text());
  return Handle(id, closer);
}

void check(herr_t status, const std::string& where, std::string_view what) {
  if (status < 0) throw_input_error(where, "{}: {}", what, hdf5_error_text());
}

Handle fixed_string_type(std::size_t size) {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), size);
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  return type;
}

Handle int64_array_type() {
  const hsize_t dims[1] = {kMaxRank};
  return Handle(H5Tarray_create2(H5T_NATIVE_INT64, 1, dims), H5Tclose);
}

Handle tensor_row_type() {
  Handle type(H5Tcreate(H5T_COMPOUND, sizeof(TensorRow)), H5Tclose);
  Handle name = fixed_string_type(kNameSize);
  Handle dims = int64_array_type();
  const hid_t t = type.get();
  H5Tinsert(t, "call_index", HOFFSET(TensorRow, call_index), H5T_NATIVE_INT64);
  H5Tinsert(t, "name", HOFFSET(TensorRow, name), name.get());
  H5Tinsert(t, "dtype", HOFFSET(TensorRow, dtype), name.get());
  H5Tinsert(t, "ndim", HOFFSET(TensorRow, ndim), H5T_NATIVE_INT32);
  H5Tinsert(t, "shape", HOFFSET(TensorRow, shape), dims.get());
  H5Tinsert(t, "strides", HOFFSET(TensorRow, strides), dims.get());
  H5Tinsert(t, "device", HOFFSET(TensorRow, device), name.get());
  H5Tinsert(t, "offset", HOFFSET(TensorRow, offset), H5T_NATIVE_INT64);
  H5Tinsert(t, "numel", HOFFSET(TensorRow, numel), H5T_NATIVE_INT64);
  H5Tinsert(t, "content_hash", HOFFSET(TensorRow, content_hash), H5T_NATIVE_UINT64);
  return type;
}

// The members a file of `version` has: HDF5 reads a compound by member names, so a v1 file is read
// with the v1 members only.
Handle call_row_type(std::int64_t version = kHdf5SchemaVersion) {
  Handle type(H5Tcreate(H5T_COMPOUND, sizeof(CallRow)), H5Tclose);
  Handle name = fixed_string_type(kNameSize);
  Handle op = fixed_string_type(kOpSize);
  const hid_t t = type.get();
  H5Tinsert(t, "call_index", HOFFSET(CallRow, call_index), H5T_NATIVE_INT64);
  H5Tinsert(t, "op", HOFFSET(CallRow, op), op.get());
  H5Tinsert(t, "backend", HOFFSET(CallRow, backend), op.get());
  H5Tinsert(t, "layout", HOFFSET(CallRow, layout), name.get());
  H5Tinsert(t, "is_causal", HOFFSET(CallRow, is_causal), H5T_NATIVE_UINT8);
  H5Tinsert(t, "causal_alignment", HOFFSET(CallRow, causal_alignment), name.get());
  H5Tinsert(t, "scale", HOFFSET(CallRow, scale), H5T_NATIVE_DOUBLE);
  H5Tinsert(t, "dropout_p", HOFFSET(CallRow, dropout_p), H5T_NATIVE_DOUBLE);
  H5Tinsert(t, "enable_gqa", HOFFSET(CallRow, enable_gqa), H5T_NATIVE_UINT8);
  H5Tinsert(t, "first_tensor", HOFFSET(CallRow, first_tensor), H5T_NATIVE_INT64);
  H5Tinsert(t, "tensor_count", HOFFSET(CallRow, tensor_count), H5T_NATIVE_INT32);
  H5Tinsert(t, "metadata_offset", HOFFSET(CallRow, metadata_offset), H5T_NATIVE_INT64);
  H5Tinsert(t, "metadata_nbytes", HOFFSET(CallRow, metadata_nbytes), H5T_NATIVE_INT64);
  if (version >= 2) {
    H5Tinsert(t, "window_left", HOFFSET(CallRow, window_left), H5T_NATIVE_INT64);
    H5Tinsert(t, "window_right", HOFFSET(CallRow, window_right), H5T_NATIVE_INT64);
    H5Tinsert(t, "softcap", HOFFSET(CallRow, softcap), H5T_NATIVE_DOUBLE);
  }
  return type;
}

// The element type of /data/<dtype>. fp32/fp16/fp64 and integers are native HDF5 types; bf16
// and fp8 have none that h5py understands, so they are stored as their raw bits (uint16/uint8).
Handle storage_type(DType dtype) {
  switch (dtype) {
    case DType::float64: return Handle(H5Tcopy(H5T_IEEE_F64LE), H5Tclose);
    case DType::float32: return Handle(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
    case DType::float16: {
      // IEEE binary16, described the way h5py describes numpy's float16.
      Handle type(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
      H5Tset_fields(type.get(), 15, 10, 5, 0, 10);
      H5Tset_size(type.get(), 2);
      H5Tset_ebias(type.get(), 15);
      return type;
    }
    case DType::bfloat16: return Handle(H5Tcopy(H5T_STD_U16LE), H5Tclose);
    case DType::int64: return Handle(H5Tcopy(H5T_STD_I64LE), H5Tclose);
    case DType::int32: return Handle(H5Tcopy(H5T_STD_I32LE), H5Tclose);
    case DType::int8: return Handle(H5Tcopy(H5T_STD_I8LE), H5Tclose);
    case DType::float8_e4m3fn:
    case DType::float8_e5m2:
    case DType::uint8:
    case DType::boolean: return Handle(H5Tcopy(H5T_STD_U8LE), H5Tclose);
  }
  return {};
}

std::string_view storage_note(DType dtype) {
  switch (dtype) {
    case DType::bfloat16: return "bfloat16 bit patterns in uint16; float32 = (x.astype('<u4') << 16).view('<f4')";
    case DType::float8_e4m3fn: return "float8_e4m3fn bit patterns in uint8; torch.from_numpy(x).view(torch.float8_e4m3fn)";
    case DType::float8_e5m2: return "float8_e5m2 bit patterns in uint8; torch.from_numpy(x).view(torch.float8_e5m2)";
    case DType::boolean: return "bool as uint8 (0 or 1)";
    default: return "native";
  }
}

void write_string_attribute(hid_t object, const char* name, std::string_view value) {
  Handle type = fixed_string_type(std::max<std::size_t>(value.size(), 1));
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attribute(H5Acreate2(object, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  std::string padded(value);
  if (padded.empty()) padded.push_back('\0');
  H5Awrite(attribute.get(), type.get(), padded.data());
}

void write_int_attribute(hid_t object, const char* name, std::int64_t value) {
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attribute(H5Acreate2(object, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  H5Awrite(attribute.get(), H5T_NATIVE_INT64, &value);
}

std::optional<std::string> read_string_attribute(hid_t object, const char* name) {
  if (H5Aexists(object, name) <= 0) return std::nullopt;
  Handle attribute(H5Aopen(object, name, H5P_DEFAULT), H5Aclose);
  Handle file_type(H5Aget_type(attribute.get()), H5Tclose);
  if (H5Tget_class(file_type.get()) != H5T_STRING) return std::nullopt;
  if (H5Tis_variable_str(file_type.get()) > 0) {
    Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), H5T_VARIABLE);
    char* text = nullptr;
    if (H5Aread(attribute.get(), mem.get(), &text) < 0 || !text) return std::nullopt;
    std::string value(text);
    H5free_memory(text);
    return value;
  }
  const std::size_t size = H5Tget_size(file_type.get());
  std::string value(size, '\0');
  Handle mem = fixed_string_type(size);
  if (H5Aread(attribute.get(), mem.get(), value.data()) < 0) return std::nullopt;
  value.resize(std::strlen(value.c_str()));
  return value;
}

std::optional<std::int64_t> read_int_attribute(hid_t object, const char* name) {
  if (H5Aexists(object, name) <= 0) return std::nullopt;
  Handle attribute(H5Aopen(object, name, H5P_DEFAULT), H5Aclose);
  std::int64_t value = 0;
  if (H5Aread(attribute.get(), H5T_NATIVE_INT64, &value) < 0) return std::nullopt;
  return value;
}

Handle create_appendable(hid_t parent, const char* name, hid_t type, hsize_t chunk_elements,
                         const std::string& where) {
  const hsize_t initial[1] = {0};
  const hsize_t unlimited[1] = {H5S_UNLIMITED};
  Handle space(H5Screate_simple(1, initial, unlimited), H5Sclose);
  Handle properties(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  const hsize_t chunk[1] = {std::max<hsize_t>(chunk_elements, 1)};
  H5Pset_chunk(properties.get(), 1, chunk);
  return check(H5Dcreate2(parent, name, type, space.get(), H5P_DEFAULT, properties.get(), H5P_DEFAULT),
               H5Dclose, where, fmt::format("cannot create dataset '{}'", name));
}

// Appends `count` elements to a 1-D dataset whose current length is `length` (updated).
void append_rows(hid_t dataset, hid_t type, const void* rows, hsize_t count, hsize_t& length,
                 const std::string& where) {
  if (count == 0) return;
  const hsize_t new_length[1] = {length + count};
  check(H5Dset_extent(dataset, new_length), where, "cannot extend a dataset");
  Handle file_space = check(H5Dget_space(dataset), H5Sclose, where, "no dataspace");
  const hsize_t start[1] = {length};
  const hsize_t counts[1] = {count};
  H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, counts, nullptr);
  Handle memory_space(H5Screate_simple(1, counts, nullptr), H5Sclose);
  check(H5Dwrite(dataset, type, memory_space.get(), file_space.get(), H5P_DEFAULT, rows), where,
        "write failed");
  length += count;
}

hsize_t dataset_length(hid_t dataset) {
  Handle space(H5Dget_space(dataset), H5Sclose);
  if (!space.valid() || H5Sget_simple_extent_ndims(space.get()) != 1) return 0;
  hsize_t dims[1] = {0};
  H5Sget_simple_extent_dims(space.get(), dims, nullptr);
  return dims[0];
}

template <std::size_t N>
void copy_name(char (&field)[N], std::string_view value) {
  std::memset(field, 0, N);
  std::memcpy(field, value.data(), std::min(value.size(), N));
}

template <std::size_t N>
std::string read_name(const char (&field)[N]) {
  return std::string(field, strnlen(field, N));
}

std::string data_path(DType dtype) { return fmt::format("/data/{}", dtype_name(dtype)); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Writer

struct Hdf5CaptureWriter::State {
  std::string path;
  Hdf5WriterOptions options;
  Handle file;
  Handle calls, tensors, metadata;
  Handle call_type = call_row_type();
  Handle tensor_type = tensor_row_type();
  std::map<DType, Handle> data;
  std::map<DType, Handle> data_types;
  std::map<DType, hsize_t> data_length;
  hsize_t calls_length = 0, tensors_length = 0, metadata_length = 0;
  // (dtype, element count, content hash) -> element offset, for deduplication.
  std::map<std::tuple<DType, std::int64_t, std::uint64_t>, std::int64_t> written;
  std::size_t calls_written = 0;
  std::uint64_t bytes_written = 0, bytes_deduplicated = 0;
};

Hdf5CaptureWriter::Hdf5CaptureWriter(const std::string& path, Hdf5WriterOptions options)
    : state_(std::make_unique<State>()) {
  const std::lock_guard lock(hdf5_mutex());
  silence_hdf5_errors();
  State& s = *state_;
  s.path = path;
  s.options = std::move(options);
  Handle access(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  // SWMR needs the 1.10 file format; readers from HDF5 1.10 on (h5py included) open it.
  H5Pset_libver_bounds(access.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
  s.file = check(H5Fcreate(path.c_str(), s.options.exclusive ? H5F_ACC_EXCL : H5F_ACC_TRUNC, H5P_DEFAULT, access.get()), H5Fclose, path,
                 "cannot create the file");
  const hid_t root = s.file.get();
  write_string_attribute(root, "attnreplay_schema", kHdf5SchemaName);
  write_int_attribute(root, "schema_version", kHdf5SchemaVersion);
  write_string_attribute(root, "producer", s.options.producer.empty() ? "attnreplay" : s.options.producer);
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  write_string_attribute(root, "created_utc", fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(now)));

  // Every dataset exists before SWMR starts: from then on the file is only appended to.
  s.calls = create_appendable(root, "calls", s.call_type.get(), 64, path);
  s.tensors = create_appendable(root, "tensors", s.tensor_type.get(), 256, path);
  s.metadata = create_appendable(root, "metadata_json", H5T_STD_U8LE, 64 * 1024, path);
  Handle group = check(H5Gcreate2(root, "data", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose, path,
                       "cannot create group /data");
  for (DType dtype : kAllDTypes) {
    Handle type = storage_type(dtype);
    const std::string name(dtype_name(dtype));
    // 1 MiB chunks: large tensors span many, small ones share one.
    Handle dataset = create_appendable(group.get(), name.c_str(), type.get(), (1u << 20) / dtype_size(dtype), path);
    write_string_attribute(dataset.get(), "torch_dtype", dtype_name(dtype));
    write_string_attribute(dataset.get(), "storage", storage_note(dtype));
    s.data.emplace(dtype, std::move(dataset));
    s.data_types.emplace(dtype, std::move(type));
    s.data_length.emplace(dtype, 0);
  }
  check(H5Fstart_swmr_write(root), path, "cannot start SWMR writing");
}

Hdf5CaptureWriter::~Hdf5CaptureWriter() {
  try {
    close();
  } catch (...) {
    // Destructors must not throw; every appended call was already flushed.
  }
}

void Hdf5CaptureWriter::append(const AttentionCall& call) {
  const std::lock_guard lock(hdf5_mutex());
  silence_hdf5_errors();
  State& s = *state_;
  ATTNREPLAY_ASSERT(s.file.valid(), "append after close");
  const std::string where = fmt::format("{}: call {}", s.path, call.call_index);
  const auto named = call.named_tensors();

  // Order matters for a reader after a crash or a full disk: tensor bytes are written and flushed
  // first; only then the rows that point at them, and last the call row, which makes the call
  // visible. A write that fails leaves no row pointing at missing data.
  std::vector<TensorRow> rows;
  for (const auto& [name, tensor] : named) {
    if (tensor->rank() > kMaxRank) throw_input_error(where, "field '{}': more than {} dims", name, kMaxRank);
    if (!tensor->bytes || tensor->bytes->size() != tensor->nbytes())
      throw_input_error(where, "field '{}': tensor has no data of {} bytes", name, tensor->nbytes());
    TensorRow row{};
    row.call_index = call.call_index;
    copy_name(row.name, name);
    copy_name(row.dtype, dtype_name(tensor->dtype));
    row.ndim = tensor->rank();
    for (int i = 0; i < tensor->rank(); ++i) {
      row.shape[i] = tensor->shape[i];
      row.strides[i] = tensor->captured_strides.empty() ? tensor->contiguous_strides()[i] : tensor->captured_strides[i];
    }
    copy_name(row.device, tensor->device);
    row.numel = tensor->numel();
    row.content_hash = content_hash(tensor->data(), tensor->nbytes());
    const auto key = std::make_tuple(tensor->dtype, row.numel, row.content_hash);
    auto found = s.options.deduplicate ? s.written.find(key) : s.written.end();
    if (found != s.written.end()) {
      row.offset = found->second;
      s.bytes_deduplicated += tensor->nbytes();
    } else {
      hsize_t& length = s.data_length[tensor->dtype];
      row.offset = static_cast<std::int64_t>(length);
      append_rows(s.data[tensor->dtype].get(), s.data_types[tensor->dtype].get(), tensor->data(),
                  static_cast<hsize_t>(row.numel), length, where);
      s.bytes_written += tensor->nbytes();
      if (s.options.deduplicate) s.written.emplace(key, row.offset);
    }
    rows.push_back(row);
  }
  CallRow call_row{};
  call_row.call_index = call.call_index;
  copy_name(call_row.op, call.op);
  copy_name(call_row.backend, call.backend);
  copy_name(call_row.layout, layout_name(call.layout));
  call_row.is_causal = call.is_causal ? 1 : 0;
  copy_name(call_row.causal_alignment, causal_alignment_name(call.causal_alignment));
  call_row.scale = call.scale ? *call.scale : std::numeric_limits<double>::quiet_NaN();
  call_row.dropout_p = call.dropout_p;
  call_row.enable_gqa = call.enable_gqa ? 1 : 0;
  call_row.window_left = call.window_left.value_or(-1);
  call_row.window_right = call.window_right.value_or(-1);
  call_row.softcap = call.softcap;
  check(H5Fflush(s.file.get(), H5F_SCOPE_GLOBAL), where, "flush failed");
  call_row.first_tensor = static_cast<std::int64_t>(s.tensors_length);
  call_row.tensor_count = static_cast<std::int32_t>(rows.size());
  append_rows(s.tensors.get(), s.tensor_type.get(), rows.data(), rows.size(), s.tensors_length, where);

  nlohmann::json metadata(call.metadata);
  if (call.op.size() > kOpSize) metadata["op"] = call.op;
  if (call.backend.size() > kOpSize) metadata["backend"] = call.backend;
  const std::string text = metadata.dump();
  call_row.metadata_offset = static_cast<std::int64_t>(s.metadata_length);
  call_row.metadata_nbytes = static_cast<std::int64_t>(text.size());
  append_rows(s.metadata.get(), H5T_NATIVE_UINT8, text.data(), text.size(), s.metadata_length, where);
  append_rows(s.calls.get(), s.call_type.get(), &call_row, 1, s.calls_length, where);
  check(H5Fflush(s.file.get(), H5F_SCOPE_GLOBAL), where, "flush failed");
  ++s.calls_written;
}

void Hdf5CaptureWriter::close() {
  const std::lock_guard lock(hdf5_mutex());
  State& s = *state_;
  if (!s.file.valid()) return;
  s.data.clear();
  s.calls.reset();
  s.tensors.reset();
  s.metadata.reset();
  if (H5Fclose(s.file.release()) < 0) throw_input_error(s.path, "closing failed: {}", hdf5_error_text());
}

std::size_t Hdf5CaptureWriter::calls_written() const { return state_->calls_written; }
std::uint64_t Hdf5CaptureWriter::bytes_written() const { return state_->bytes_written; }
std::uint64_t Hdf5CaptureWriter::bytes_deduplicated() const { return state_->bytes_deduplicated; }

// ---------------------------------------------------------------------------------------------
// Reader

bool looks_like_hdf5(const std::string& path) {
  static constexpr unsigned char kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  std::ifstream in(path, std::ios::binary);
  // The superblock sits at 0 or, after a user block, at 512, 1024, 2048, ...
  for (std::streamoff offset = 0; in; offset = offset == 0 ? 512 : offset * 2) {
    unsigned char head[8] = {};
    in.seekg(offset);
    if (!in.read(reinterpret_cast<char*>(head), 8)) return false;
    if (std::memcmp(head, kSignature, 8) == 0) return true;
    if (offset > (1 << 20)) return false;
  }
  return false;
}

namespace {

class Hdf5CaptureSource final : public CaptureSource {
 public:
  explicit Hdf5CaptureSource(std::string path) : path_(std::move(path)) {
    const std::lock_guard lock(hdf5_mutex());
    silence_hdf5_errors();
    file_ = Handle(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (!file_.valid()) {
      // A writer that was killed leaves the SWMR-writing flag set; SWMR readers ignore it.
      const std::string first_error = hdf5_error_text();
      file_ = Handle(H5Fopen(path_.c_str(), H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, H5P_DEFAULT), H5Fclose);
      if (!file_.valid()) {
        throw_input_error(path_, "cannot be read as HDF5 (truncated or corrupt?): {}", first_error);
      }
    }
    // A file cut short after a crash opens in SWMR mode, which skips HDF5's own length check:
    // compare the file's length with the end of its allocated space ourselves.
    haddr_t end_of_allocation = 0;
    std::error_code size_error;
    const auto file_size = std::filesystem::file_size(path_, size_error);
    if (!size_error && H5Fget_eoa(file_.get(), &end_of_allocation) >= 0 && file_size < end_of_allocation) {
      throw_input_error(path_, "truncated: {} bytes, but its data extends to {} bytes", file_size, end_of_allocation);
    }
    const hid_t root = file_.get();
    const auto schema = read_string_attribute(root, "attnreplay_schema");
    if (!schema || *schema != kHdf5SchemaName) {
      throw_input_error(path_, "not an attnreplay capture: root attribute 'attnreplay_schema' is {}",
                        schema ? "'" + *schema + "'" : std::string("missing"));
    }
    const auto version = read_int_attribute(root, "schema_version");
    if (!version) throw_input_error(path_, "root attribute 'schema_version' is missing");
    if (*version > kHdf5SchemaVersion || *version < 1) {
      throw_input_error(path_, "schema_version {} is not readable by this build (reads 1..{})", *version,
                        kHdf5SchemaVersion);
    }
    version_ = *version;
    calls_ = read_table<CallRow>("calls", call_row_type(version_));
    if (version_ < 2) {
      for (CallRow& row : calls_) row.window_left = row.window_right = -1, row.softcap = 0;
    }
    // Calls are appended as they finish, which threads can reorder: present them by index.
    std::stable_sort(calls_.begin(), calls_.end(),
                     [](const CallRow& a, const CallRow& b) { return a.call_index < b.call_index; });
    tensors_ = read_table<TensorRow>("tensors", tensor_row_type());
    metadata_ = read_table<std::uint8_t>("metadata_json", Handle(H5Tcopy(H5T_NATIVE_UINT8), H5Tclose));
  }

  const std::string& path() const override { return path_; }
  std::string format() const override { return fmt::format("attnreplay-hdf5 v{}", version_); }
  std::size_t size() const override { return calls_.size(); }
  const std::vector<std::string>& open_errors() const override { return open_errors_; }

  AttentionCall load(std::size_t position, bool with_data) override {
    const std::lock_guard lock(hdf5_mutex());
    const CallRow& row = calls_.at(position);
    AttentionCall call;
    call.source = path_;
    call.call_index = row.call_index;
    const std::string where = call.where();
    call.op = read_name(row.op);
    call.backend = read_name(row.backend);
    const auto layout = parse_layout(read_name(row.layout));
    if (!layout) throw_input_error(where, "field 'layout': expected bhsd, bshd or thd, got '{}'", read_name(row.layout));
    call.layout = *layout;
    call.is_causal = row.is_causal != 0;
    const auto alignment = parse_causal_alignment(read_name(row.causal_alignment));
    if (!alignment) {
      throw_input_error(where, "field 'causal_alignment': expected top_left or bottom_right, got '{}'",
                        read_name(row.causal_alignment));
    }
    call.causal_alignment = *alignment;
    if (!std::isnan(row.scale)) call.scale = row.scale;
    call.dropout_p = row.dropout_p;
    call.enable_gqa = row.enable_gqa != 0;
    if (row.window_left >= 0) call.window_left = row.window_left;
    if (row.window_right >= 0) call.window_right = row.window_right;
    call.softcap = row.softcap;
    load_metadata(row, call, where);

    if (row.first_tensor < 0 || row.tensor_count < 0 ||
        static_cast<std::size_t>(row.first_tensor) + static_cast<std::size_t>(row.tensor_count) > tensors_.size()) {
      throw_input_error(where, "field 'tensors': rows [{}, {}) lie beyond the 'tensors' table ({} rows)",
                        row.first_tensor, row.first_tensor + row.tensor_count, tensors_.size());
    }
    bool seen_q = false, seen_k = false, seen_v = false;
    for (std::int32_t i = 0; i < row.tensor_count; ++i) {
      const TensorRow& tensor_row = tensors_[static_cast<std::size_t>(row.first_tensor + i)];
      const std::string name = read_name(tensor_row.name);
      if (tensor_row.call_index != row.call_index) {
        throw_input_error(where, "field '{}': tensor row {} belongs to call {}", name, row.first_tensor + i,
                          tensor_row.call_index);
      }
      HostTensor* field = call.tensor_field(name);
      if (!field) {
        throw_input_error(where, "field '{}': unknown tensor name (expected q, k, v, mask, out, alibi_slopes, sinks, cu_seqlens_q, "
                          "cu_seqlens_k, seqused_k, block_table)",
                          name);
      }
      *field = load_tensor(tensor_row, where, name, with_data);
      seen_q |= name == "q", seen_k |= name == "k", seen_v |= name == "v";
    }
    if (!seen_q) throw_input_error(where, "field 'q': missing");
    if (!seen_k) throw_input_error(where, "field 'k': missing");
    if (!seen_v) throw_input_error(where, "field 'v': missing");
    call.shape();  // cross-checks Q, K, V, mask and out
    return call;
  }

 private:
  template <typename Row>
  std::vector<Row> read_table(const char* name, Handle memory_type) {
    const hid_t root = file_.get();
    if (H5Lexists(root, name, H5P_DEFAULT) <= 0) throw_input_error(path_, "dataset '/{}' is missing", name);
    Handle dataset = check(H5Dopen2(root, name, H5P_DEFAULT), H5Dclose, path_, fmt::format("cannot open '/{}'", name));
    std::vector<Row> rows(dataset_length(dataset.get()));
    if (!rows.empty() &&
        H5Dread(dataset.get(), memory_type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data()) < 0) {
      throw_input_error(path_, "dataset '/{}' cannot be read (corrupt, or a field is missing): {}", name,
                        hdf5_error_text());
    }
    return rows;
  }

  void load_metadata(const CallRow& row, AttentionCall& call, const std::string& where) {
    if (row.metadata_nbytes == 0) return;
    if (row.metadata_offset < 0 || row.metadata_nbytes < 0 ||
        static_cast<std::size_t>(row.metadata_offset + row.metadata_nbytes) > metadata_.size()) {
      throw_input_error(where, "field 'metadata': bytes [{}, {}) lie beyond '/metadata_json' ({} bytes)",
                        row.metadata_offset, row.metadata_offset + row.metadata_nbytes, metadata_.size());
    }
    const std::string text(reinterpret_cast<const char*>(metadata_.data()) + row.metadata_offset,
                           static_cast<std::size_t>(row.metadata_nbytes));
    const nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_object()) throw_input_error(where, "field 'metadata': expected a JSON object, got '{}'", text);
    // The writer puts an op or backend in the JSON only when it overflows its fixed-width field;
    // otherwise an "op" or "backend" key is the capture's own metadata and stays there.
    auto overflow = [](const auto& field, const std::string& truncated, const nlohmann::json& value) {
      return strnlen(field, sizeof(field)) == sizeof(field) && value.is_string() &&
             value.get<std::string>().starts_with(truncated);
    };
    for (const auto& [key, value] : parsed.items()) {
      if (key == "op" && overflow(row.op, call.op, value)) call.op = value.get<std::string>();
      else if (key == "backend" && overflow(row.backend, call.backend, value)) call.backend = value.get<std::string>();
      else call.metadata[key] = value.is_string() ? value.get<std::string>() : value.dump();
    }
  }

  HostTensor load_tensor(const TensorRow& row, const std::string& where, const std::string& name, bool with_data) {
    const auto dtype = parse_dtype(read_name(row.dtype));
    if (!dtype) throw_input_error(where, "field '{}': unknown dtype '{}'", name, read_name(row.dtype));
    if (row.ndim < 0 || row.ndim > kMaxRank) throw_input_error(where, "field '{}': ndim {} out of range", name, row.ndim);
    HostTensor tensor;
    tensor.dtype = *dtype;
    tensor.device = read_name(row.device);
    std::int64_t count = 1;
    for (int i = 0; i < row.ndim; ++i) {
      if (row.shape[i] < 0) throw_input_error(where, "field '{}': negative dim {}", name, row.shape[i]);
      tensor.shape.push_back(row.shape[i]);
      tensor.captured_strides.push_back(row.strides[i]);
      count *= row.shape[i];
    }
    if (count != row.numel) {
      throw_input_error(where, "field '{}': shape {} has {} elements, but numel says {}", name,
                        shape_string(tensor.shape), count, row.numel);
    }
    Handle& dataset = open_data(*dtype, where);
    const hsize_t length = dataset_length(dataset.get());
    if (row.offset < 0 || static_cast<hsize_t>(row.offset) + static_cast<hsize_t>(row.numel) > length) {
      throw_input_error(where, "field '{}': elements [{}, {}) lie beyond '{}' ({} elements); the file was cut short",
                        name, row.offset, row.offset + row.numel, data_path(*dtype), length);
    }
    if (!with_data) return tensor;
    auto bytes = allocate_bytes(static_cast<std::size_t>(row.numel) * dtype_size(*dtype));
    if (row.numel > 0) {
      Handle file_space(H5Dget_space(dataset.get()), H5Sclose);
      const hsize_t start[1] = {static_cast<hsize_t>(row.offset)};
      const hsize_t counts[1] = {static_cast<hsize_t>(row.numel)};
      H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, counts, nullptr);
      Handle memory_space(H5Screate_simple(1, counts, nullptr), H5Sclose);
      Handle type = storage_type(*dtype);
      if (H5Dread(dataset.get(), type.get(), memory_space.get(), file_space.get(), H5P_DEFAULT, bytes->data()) < 0) {
        throw_input_error(where, "field '{}': reading '{}' failed: {}", name, data_path(*dtype), hdf5_error_text());
      }
    }
    tensor.bytes = std::move(bytes);
    return tensor;
  }

  Handle& open_data(DType dtype, const std::string& where) {
    auto found = data_.find(dtype);
    if (found != data_.end()) return found->second;
    const std::string path = data_path(dtype);
    if (H5Lexists(file_.get(), "data", H5P_DEFAULT) <= 0 ||
        H5Lexists(file_.get(), path.c_str(), H5P_DEFAULT) <= 0) {
      throw_input_error(where, "dataset '{}' is missing", path);
    }
    Handle dataset = check(H5Dopen2(file_.get(), path.c_str(), H5P_DEFAULT), H5Dclose, where,
                           fmt::format("cannot open '{}'", path));
    return data_.emplace(dtype, std::move(dataset)).first->second;
  }

  std::string path_;
  std::int64_t version_ = kHdf5SchemaVersion;
  Handle file_;
  std::vector<CallRow> calls_;
  std::vector<TensorRow> tensors_;
  std::vector<std::uint8_t> metadata_;
  std::map<DType, Handle> data_;
  std::vector<std::string> open_errors_;
};

}  // namespace

std::unique_ptr<CaptureSource> open_hdf5_capture(const std::string& path) {
  return std::make_unique<Hdf5CaptureSource>(path);
}

}  // namespace attnreplay
