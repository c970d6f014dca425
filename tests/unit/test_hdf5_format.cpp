// The HDF5 capture schema (formats/hdf5_format.cpp): exact round trips for every floating dtype,
// layout, mask kind and flag; deduplication; precise errors for damaged or foreign files; and
// calls that survive a writer killed without close() (SWMR).
#include <hdf5.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "call_fixtures.h"
#include "formats/capture_source.h"
#include "formats/errors.h"
#include "formats/hdf5_format.h"

using namespace attnreplay;
using namespace attnreplay::test;
using Catch::Matchers::ContainsSubstring;

namespace {

// Every combination the schema must keep apart, each as its own call.
std::vector<AttentionCall> matrix_calls() {
  std::vector<AttentionCall> calls;
  std::int64_t index = 0;
  for (DType dtype : kFloatingDTypes)
    for (Layout layout : {Layout::bhsd, Layout::bshd})
      for (MaskKind mask : {MaskKind::none, MaskKind::boolean, MaskKind::floating})
        for (bool with_scale : {false, true}) {
          CallSpec spec;
          spec.dtype = dtype;
          spec.layout = layout;
          spec.mask = mask;
          spec.with_out = (index % 2) == 0 || mask == MaskKind::floating;
          if (with_scale) spec.scale = 0.0625 + static_cast<double>(index);
          spec.call_index = 100 + index;
          spec.seed = static_cast<std::uint64_t>(1000 + index);
          calls.push_back(random_call(spec));
          ++index;
        }
  return calls;
}

// Elements in a 1-D dataset of a closed file, read with the HDF5 C API.
hsize_t data_length(const std::string& path, const char* dataset_path) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(file >= 0);
  const hid_t dataset = H5Dopen2(file, dataset_path, H5P_DEFAULT);
  REQUIRE(dataset >= 0);
  const hid_t space = H5Dget_space(dataset);
  hsize_t length = 0;
  H5Sget_simple_extent_dims(space, &length, nullptr);
  H5Sclose(space);
  H5Dclose(dataset);
  H5Fclose(file);
  return length;
}

void write_calls(const std::string& path, const std::vector<AttentionCall>& calls, Hdf5WriterOptions options = {}) {
  Hdf5CaptureWriter writer(path, std::move(options));
  for (const AttentionCall& call : calls) writer.append(call);
  writer.close();
}

}  // namespace

TEST_CASE("hdf5: every floating dtype, layout, mask kind and flag reads back bit for bit") {
  TempDir dir("h5-roundtrip");
  const std::string path = dir.file("calls.h5");
  const std::vector<AttentionCall> calls = matrix_calls();
  REQUIRE(calls.size() == 72);
  write_calls(path, calls);

  REQUIRE(looks_like_hdf5(path));
  auto source = open_capture(path);
  CHECK(source->format() == fmt::format("attnreplay-hdf5 v{}", kHdf5SchemaVersion));
  CHECK(source->path() == path);
  CHECK(source->open_errors().empty());
  REQUIRE(source->size() == calls.size());
  for (std::size_t i = 0; i < calls.size(); ++i) {
    INFO("call " << calls[i].call_index << ", " << dtype_name(calls[i].q.dtype) << " "
                 << layout_name(calls[i].layout));
    const AttentionCall got = source->load(i);
    check_same_call(got, calls[i]);
    CHECK(got.source == path);
  }
}

TEST_CASE("hdf5: loading without data gives shapes, dtypes and strides but no bytes") {
  TempDir dir("h5-nodata");
  const std::string path = dir.file("calls.h5");
  CallSpec spec;
  spec.dtype = DType::bfloat16;
  spec.layout = Layout::bshd;
  spec.mask = MaskKind::boolean;
  const AttentionCall call = random_call(spec);
  write_calls(path, {call});
  const AttentionCall header = open_capture(path)->load(0, /*with_data=*/false);
  CHECK(header.q.shape == call.q.shape);
  CHECK(header.q.captured_strides == call.q.captured_strides);
  CHECK(header.q.dtype == DType::bfloat16);
  CHECK(header.q.bytes == nullptr);
  REQUIRE(header.mask.has_value());
  CHECK(header.mask->dtype == DType::boolean);
}

TEST_CASE("hdf5: an op or backend longer than the fixed-width field survives whole") {
  // The row holds 128 characters; the rest must come back from the call's metadata JSON.
  TempDir dir("h5-longop");
  const std::string path = dir.file("calls.h5");
  AttentionCall call = random_call({});
  call.op = std::string(300, 'o') + "::end";
  call.backend = std::string(129, 'b');
  write_calls(path, {call});
  const AttentionCall got = open_capture(path)->load(0);
  CHECK(got.op == call.op);
  CHECK(got.backend == call.backend);
  CHECK(got.metadata == call.metadata);  // "op"/"backend" do not leak into the metadata
}

TEST_CASE("hdf5: metadata keys named 'op' and 'backend' stay metadata") {
  // The long-op overflow shares the metadata JSON; a capture's own "op" entry must not replace the
  // call's op when the op fitted in its field.
  TempDir dir("h5-opkey");
  const std::string path = dir.file("calls.h5");
  AttentionCall call = random_call({});
  call.op = "aten::scaled_dot_product_attention";
  call.backend = "math";
  call.metadata["op"] = "attention block 3";
  call.metadata["backend"] = "whatever the model said";
  write_calls(path, {call});
  const AttentionCall got = open_capture(path)->load(0);
  CHECK(got.op == call.op);
  CHECK(got.backend == call.backend);
  CHECK(got.metadata == call.metadata);
}

TEST_CASE("hdf5: identical tensors are stored once and still read back") {
  TempDir dir("h5-dedup");
  CallSpec spec;
  spec.dtype = DType::float16;
  AttentionCall first = random_call(spec);
  // Within a call: V is K's tensor again (d_vo = d_qk here). Across calls: a CFG-style duplicate
  // repeats the first call's K and V exactly.
  first.v = first.k;
  AttentionCall second = random_call({.dtype = DType::float16, .call_index = 1, .seed = 99});
  second.k = first.k;
  second.v = first.k;
  const std::size_t k_bytes = first.k.nbytes();

  const std::string path = dir.file("dedup.h5");
  {
    Hdf5CaptureWriter writer(path);
    writer.append(first);
    CHECK(writer.bytes_deduplicated() == k_bytes);
    CHECK(writer.bytes_written() == first.q.nbytes() + k_bytes);
    writer.append(second);
    CHECK(writer.bytes_deduplicated() == 3 * k_bytes);
    // Only the second call's q is new.
    CHECK(writer.bytes_written() == first.q.nbytes() + k_bytes + second.q.nbytes());
    CHECK(writer.calls_written() == 2);
    writer.close();
  }
  auto source = open_capture(path);
  REQUIRE(source->size() == 2);
  check_same_call(source->load(0), first);
  check_same_call(source->load(1), second);

  // With deduplication off every tensor is written.
  const std::string plain = dir.file("plain.h5");
  Hdf5WriterOptions options;
  options.deduplicate = false;
  Hdf5CaptureWriter writer(plain, options);
  writer.append(first);
  writer.append(second);
  CHECK(writer.bytes_deduplicated() == 0);
  writer.close();
  check_same_call(open_capture(plain)->load(1), second);
  // In the files themselves: /data/float16 holds q, k and the second q once, or all six tensors.
  const auto q_elements = static_cast<hsize_t>(first.q.numel()), k_elements = static_cast<hsize_t>(first.k.numel());
  CHECK(data_length(path, "/data/float16") == 2 * q_elements + k_elements);
  CHECK(data_length(plain, "/data/float16") == 2 * q_elements + 4 * k_elements);
}

TEST_CASE("hdf5: equal bytes in different dtypes are not merged") {
  // The dedup key includes the dtype: a bf16 tensor with an fp16 tensor's bytes is another tensor.
  TempDir dir("h5-dtypes");
  const std::string path = dir.file("calls.h5");
  AttentionCall half = random_call({.dtype = DType::float16});
  AttentionCall brain = half;
  brain.call_index = 1;
  for (HostTensor* t : {&brain.q, &brain.k, &brain.v}) t->dtype = DType::bfloat16;
  write_calls(path, {half, brain});
  auto source = open_capture(path);
  check_same_call(source->load(0), half);
  check_same_call(source->load(1), brain);
}

TEST_CASE("hdf5: a truncated file is an InputError naming the file") {
  TempDir dir("h5-truncated");
  const std::string path = dir.file("cut.h5");
  std::vector<AttentionCall> calls;
  for (int i = 0; i < 4; ++i) calls.push_back(random_call({.dtype = DType::float64, .call_index = i, .seed = 7u + i}));
  write_calls(path, calls);
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size / 2);
  CHECK_THROWS_AS(open_capture(path), InputError);
  CHECK_THROWS_WITH(open_capture(path), ContainsSubstring(path));
}

TEST_CASE("hdf5: an HDF5 file that is not a capture names 'attnreplay_schema'") {
  TempDir dir("h5-foreign");
  const std::string path = dir.file("foreign.h5");
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(file >= 0);
  H5Fclose(file);
  REQUIRE(looks_like_hdf5(path));
  CHECK_THROWS_AS(open_capture(path), InputError);
  CHECK_THROWS_WITH(open_capture(path), ContainsSubstring(path) && ContainsSubstring("attnreplay_schema"));
}

TEST_CASE("hdf5: a schema_version from the future is refused by name") {
  TempDir dir("h5-version");
  const std::string path = dir.file("future.h5");
  write_calls(path, {random_call({})});
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(file >= 0);
  const hid_t attribute = H5Aopen(file, "schema_version", H5P_DEFAULT);
  REQUIRE(attribute >= 0);
  const std::int64_t future = kHdf5SchemaVersion + 1;
  REQUIRE(H5Awrite(attribute, H5T_NATIVE_INT64, &future) >= 0);
  H5Aclose(attribute);
  H5Fclose(file);
  CHECK_THROWS_WITH(open_capture(path), ContainsSubstring(fmt::format("schema_version {}", future)));
}

TEST_CASE("hdf5: a path that does not exist is an InputError naming it") {
  TempDir dir("h5-missing");
  const std::string path = dir.file("nothing-here.h5");
  CHECK_THROWS_AS(open_capture(path), InputError);
  CHECK_THROWS_WITH(open_capture(path), ContainsSubstring(path));
  CHECK_THROWS_AS(open_hdf5_capture(path), InputError);
}

namespace {

// Points one tensor row of /tensors past the end of its data, through the HDF5 C API, touching
// only the 'offset' member.
void corrupt_offset(const std::string& path, std::int64_t call_index, const char* name, std::int64_t offset) {
  struct Key {
    std::int64_t call_index;
    char name[16];
  };
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(file >= 0);
  const hid_t dataset = H5Dopen2(file, "tensors", H5P_DEFAULT);
  REQUIRE(dataset >= 0);
  const hid_t space = H5Dget_space(dataset);
  hsize_t rows = 0;
  H5Sget_simple_extent_dims(space, &rows, nullptr);
  H5Sclose(space);

  const hid_t name_type = H5Tcopy(H5T_C_S1);
  H5Tset_size(name_type, 16);
  H5Tset_strpad(name_type, H5T_STR_NULLPAD);
  const hid_t key_type = H5Tcreate(H5T_COMPOUND, sizeof(Key));
  H5Tinsert(key_type, "call_index", HOFFSET(Key, call_index), H5T_NATIVE_INT64);
  H5Tinsert(key_type, "name", HOFFSET(Key, name), name_type);
  std::vector<Key> keys(rows);
  REQUIRE(H5Dread(dataset, key_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, keys.data()) >= 0);

  const hid_t offset_type = H5Tcreate(H5T_COMPOUND, sizeof(std::int64_t));
  H5Tinsert(offset_type, "offset", 0, H5T_NATIVE_INT64);
  std::vector<std::int64_t> offsets(rows);
  REQUIRE(H5Dread(dataset, offset_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets.data()) >= 0);
  int changed = 0;
  for (hsize_t i = 0; i < rows; ++i) {
    if (keys[i].call_index == call_index && std::strncmp(keys[i].name, name, 16) == 0) {
      offsets[i] = offset;
      ++changed;
    }
  }
  REQUIRE(changed == 1);
  REQUIRE(H5Dwrite(dataset, offset_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets.data()) >= 0);
  H5Tclose(offset_type);
  H5Tclose(key_type);
  H5Tclose(name_type);
  H5Dclose(dataset);
  H5Fclose(file);
}

}  // namespace

TEST_CASE("hdf5: a tensor row pointing beyond its data fails that call only") {
  TempDir dir("h5-badrow");
  const std::string path = dir.file("calls.h5");
  std::vector<AttentionCall> calls;
  for (int i = 0; i < 3; ++i) calls.push_back(random_call({.dtype = DType::bfloat16, .call_index = i, .seed = 50u + i}));
  write_calls(path, calls);
  corrupt_offset(path, 1, "k", std::int64_t{1} << 40);
  {
    auto source = open_capture(path);
    REQUIRE(source->size() == 3);
    check_same_call(source->load(0), calls[0]);
    check_same_call(source->load(2), calls[2]);
    CHECK_THROWS_AS(source->load(1), InputError);
    CHECK_THROWS_WITH(source->load(1), ContainsSubstring(path + ": call 1") && ContainsSubstring("field 'k'") &&
                                           ContainsSubstring("/data/bfloat16"));
    // The header alone already knows the data is missing.
    CHECK_THROWS_AS(source->load(1, /*with_data=*/false), InputError);
  }
  // A negative offset is caught the same way.
  corrupt_offset(path, 2, "v", -5);
  CHECK_THROWS_WITH(open_capture(path)->load(2), ContainsSubstring("call 2") && ContainsSubstring("field 'v'"));
}

TEST_CASE("hdf5: calls appended before the writer is killed read back (SWMR, no close)") {
  TempDir dir("h5-swmr");
  const std::string path = dir.file("crash.h5");
  std::vector<AttentionCall> calls;
  for (int i = 0; i < 3; ++i) {
    calls.push_back(random_call({.dtype = DType::float16, .layout = Layout::bshd, .mask = MaskKind::boolean,
                                 .with_out = true, .call_index = i, .seed = 300u + i}));
  }
  int ready[2], release[2];
  REQUIRE(pipe(ready) == 0);
  REQUIRE(pipe(release) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // The child: append three calls, tell the parent, wait, and never close the writer.
    close(ready[0]);
    close(release[1]);
    char status = 'x';
    try {
      auto* writer = new Hdf5CaptureWriter(path);  // leaked on purpose: no destructor, no close
      for (const AttentionCall& call : calls) writer->append(call);
      status = 'k';
    } catch (...) {
    }
    (void)!write(ready[1], &status, 1);
    char ignored;
    (void)!read(release[0], &ignored, 1);  // blocks until the parent kills us
    _exit(3);
  }
  // If a check below fails, the child must not outlive the test.
  struct ChildGuard {
    pid_t pid;
    ~ChildGuard() {
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
  } guard{child};
  close(ready[1]);
  close(release[0]);
  char status = 0;
  REQUIRE(read(ready[0], &status, 1) == 1);
  REQUIRE(status == 'k');

  // While the writer is still alive and holds the file open for SWMR writing.
  {
    auto source = open_capture(path);
    REQUIRE(source->size() == 3);
    for (std::size_t i = 0; i < 3; ++i) check_same_call(source->load(i), calls[i]);
  }

  // After it is killed without close().
  REQUIRE(kill(child, SIGKILL) == 0);
  int wait_status = 0;
  REQUIRE(waitpid(child, &wait_status, 0) == child);
  guard.pid = -1;
  CHECK(WIFSIGNALED(wait_status));
  close(ready[0]);
  close(release[1]);
  auto source = open_capture(path);
  REQUIRE(source->size() == 3);
  for (std::size_t i = 0; i < 3; ++i) check_same_call(source->load(i), calls[i]);
}
