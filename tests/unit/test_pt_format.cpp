// .pt files through libtorch (formats/pt_format.cpp): exact round trips of our own files, strides
// kept, declared shapes checked, clear errors for files that are not .pt, and aiter's folder of
// per-call files ordered by call_idx with its kwargs applied.
#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <fstream>

#include "call_fixtures.h"
#include "formats/capture_source.h"
#include "formats/errors.h"
#include "formats/pt_format.h"

using namespace attnreplay;
using namespace attnreplay::test;
using Catch::Matchers::ContainsSubstring;

namespace {

using Dict = c10::impl::GenericDict;

Dict new_dict() { return Dict(c10::StringType::get(), c10::AnyType::get()); }

void save(const c10::IValue& value, const std::string& path) {
  const std::vector<char> bytes = torch::jit::pickle_save(value);
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

at::Tensor randn(std::vector<std::int64_t> shape) {
  return at::randn(shape, at::TensorOptions().dtype(at::kFloat));
}

// An aiter-style call dict: q, k, v, call_idx, and the caller's kwargs.
Dict aiter_call(std::int64_t call_idx, bool is_causal, std::optional<double> scale) {
  Dict dict = new_dict();
  dict.insert("q", randn({1, 2, 4, 8}));
  dict.insert("k", randn({1, 2, 6, 8}));
  dict.insert("v", randn({1, 2, 6, 8}));
  dict.insert("call_idx", call_idx);
  Dict kwargs = new_dict();
  kwargs.insert("is_causal", is_causal);
  kwargs.insert("scale", scale ? c10::IValue(*scale) : c10::IValue());
  kwargs.insert("backend_hint", std::string("ck"));
  dict.insert("kwargs", kwargs);
  return dict;
}

}  // namespace

TEST_CASE("pt: one call per file, every dtype and layout, bit for bit") {
  TempDir dir("pt-single");
  int index = 0;
  for (DType dtype : kFloatingDTypes)
    for (Layout layout : {Layout::bhsd, Layout::bshd}) {
      CallSpec spec;
      spec.dtype = dtype;
      spec.layout = layout;
      spec.mask = index % 3 == 0 ? MaskKind::none : index % 3 == 1 ? MaskKind::boolean : MaskKind::floating;
      spec.with_out = index % 2 == 0;
      if (index % 2) spec.scale = 0.3 + index;
      spec.call_index = 40 + index;
      spec.seed = 500u + static_cast<std::uint64_t>(index);
      const AttentionCall call = random_call(spec);
      const std::string path = dir.file("call_" + std::to_string(index) + ".pt");
      write_pt_call(call, path);
      INFO(dtype_name(dtype) << " " << layout_name(layout));
      REQUIRE(looks_like_zip(path));
      CHECK_FALSE(std::filesystem::exists(path + ".partial"));  // written beside, then renamed
      auto source = open_capture(path);
      REQUIRE(source->size() == 1);
      const AttentionCall got = source->load(0);
      check_same_call(got, call);
      CHECK(got.source == path);
      ++index;
    }
}

TEST_CASE("pt: many calls in one file come back in call order") {
  TempDir dir("pt-many");
  std::vector<AttentionCall> calls;
  for (DType dtype : kFloatingDTypes) {
    calls.push_back(random_call({.dtype = dtype, .layout = Layout::bshd, .mask = MaskKind::boolean,
                                 .with_out = true, .call_index = static_cast<std::int64_t>(10 - calls.size()),
                                 .seed = 900u + calls.size()}));
  }
  const std::string path = dir.file("all.pt");
  write_pt_calls(calls, path);
  auto source = open_capture(path);
  REQUIRE(source->size() == calls.size());
  // Written with indices 10, 9, ..., 5: read back ascending.
  for (std::size_t i = 0; i < calls.size(); ++i) check_same_call(source->load(i), calls[calls.size() - 1 - i]);
}

TEST_CASE("pt: captured strides survive (a transposed view stays transposed)") {
  TempDir dir("pt-strides");
  AttentionCall call = random_call({.dtype = DType::bfloat16});
  // q's strides are a transposed view's (set by random_call); make k expanded over heads too:
  // one head's data, repeated, as an .expand() leaves it.
  const auto& kshape = call.k.shape;
  HostTensor expanded = HostTensor::allocate(DType::bfloat16, kshape);
  const std::size_t head_bytes = static_cast<std::size_t>(kshape[2] * kshape[3]) * 2;
  for (std::int64_t b = 0; b < kshape[0]; ++b)
    for (std::int64_t h = 0; h < kshape[1]; ++h)
      std::memcpy(expanded.mutable_data() + static_cast<std::size_t>(b * kshape[1] + h) * head_bytes,
                  call.k.data() + static_cast<std::size_t>(b * kshape[1]) * head_bytes, head_bytes);
  expanded.captured_strides = {kshape[1] * kshape[2] * kshape[3], 0, kshape[3], 1};
  call.k = expanded;
  REQUIRE_FALSE(call.q.captured_contiguous());
  const std::string path = dir.file("strided.pt");
  write_pt_call(call, path);
  const AttentionCall got = open_capture(path)->load(0);
  CHECK(got.q.captured_strides == call.q.captured_strides);
  CHECK(got.k.captured_strides == call.k.captured_strides);
  check_same_call(got, call);
}

TEST_CASE("pt: a q_shape that disagrees with q names the file and 'q_shape'") {
  TempDir dir("pt-qshape");
  const std::string path = dir.file("bad_shape.pt");
  Dict dict = new_dict();
  dict.insert("q", randn({1, 2, 4, 8}));
  dict.insert("k", randn({1, 2, 4, 8}));
  dict.insert("v", randn({1, 2, 4, 8}));
  dict.insert("q_shape", std::vector<std::int64_t>{1, 2, 5, 8});
  dict.insert("k_shape", std::vector<std::int64_t>{1, 2, 4, 8});  // right, so only q is blamed
  save(dict, path);
  auto source = open_capture(path);
  CHECK_THROWS_AS(source->load(0), InputError);
  CHECK_THROWS_WITH(source->load(0), ContainsSubstring(path) && ContainsSubstring("'q_shape'") &&
                                         ContainsSubstring("1x2x5x8") && ContainsSubstring("1x2x4x8"));
}

TEST_CASE("pt: plain {query, key, value} dicts with a tuple shape are read") {
  TempDir dir("pt-plain");
  const std::string path = dir.file("plain.pt");
  Dict dict = new_dict();
  at::Tensor q = randn({1, 3, 2, 4});
  dict.insert("query", q);
  dict.insert("key", randn({1, 5, 2, 4}));
  dict.insert("value", randn({1, 5, 2, 4}));
  dict.insert("layout", std::string("bshd"));
  dict.insert("causal", true);
  dict.insert("softmax_scale", 0.5);
  dict.insert("q_shape", c10::ivalue::Tuple::create({int64_t{1}, int64_t{3}, int64_t{2}, int64_t{4}}));
  save(dict, path);
  const AttentionCall call = open_capture(path)->load(0);
  CHECK(call.layout == Layout::bshd);
  CHECK(call.is_causal);
  CHECK(call.scale == 0.5);
  CHECK(call.shape() == AttentionShape{1, 2, 2, 3, 5, 4, 4});
  REQUIRE(call.q.nbytes() == static_cast<std::size_t>(q.nbytes()));
  CHECK(std::memcmp(call.q.data(), q.data_ptr(), q.nbytes()) == 0);
}

TEST_CASE("pt: empty, garbage, truncated and legacy files give clear errors") {
  TempDir dir("pt-bad");
  const std::string empty = dir.file("empty.pt");
  std::ofstream(empty, std::ios::binary).flush();
  CHECK_THROWS_AS(open_capture(empty), InputError);
  CHECK_THROWS_WITH(open_capture(empty), ContainsSubstring(empty) && ContainsSubstring("empty"));

  const std::string garbage = dir.file("garbage.pt");
  std::ofstream(garbage, std::ios::binary) << "this is not a torch file at all";
  CHECK_THROWS_AS(open_capture(garbage), InputError);
  CHECK_THROWS_WITH(open_capture(garbage), ContainsSubstring(garbage) && ContainsSubstring("neither an HDF5 capture, a torch.save"));
  // The error says what the content is, whatever the name says.
  const std::string named_h5 = dir.file("random.h5");
  std::ofstream(named_h5, std::ios::binary) << "\x13\x37random bytes";
  CHECK_THROWS_WITH(open_capture(named_h5),
                    ContainsSubstring(named_h5) && ContainsSubstring("neither an HDF5 capture, a torch.save") &&
                        ContainsSubstring("13 37"));

  const std::string legacy = dir.file("legacy.pt");
  std::ofstream(legacy, std::ios::binary) << "\x80\x02garbage";
  CHECK_THROWS_WITH(open_capture(legacy), ContainsSubstring(legacy) && ContainsSubstring("legacy"));

  // A real file cut in half still starts with the zip signature.
  const std::string cut = dir.file("cut.pt");
  write_pt_call(random_call({.dtype = DType::float32}), cut);
  const auto size = std::filesystem::file_size(cut);
  std::filesystem::resize_file(cut, size / 2);
  CHECK_THROWS_AS(open_capture(cut), InputError);
  CHECK_THROWS_WITH(open_capture(cut), ContainsSubstring(cut));

  // A well-formed .pt that holds no call.
  const std::string list = dir.file("list.pt");
  save(c10::IValue(std::vector<std::int64_t>{1, 2, 3}), list);
  CHECK_THROWS_WITH(open_capture(list), ContainsSubstring(list) && ContainsSubstring("expected a dict"));
  const std::string no_q = dir.file("no_q.pt");
  Dict dict = new_dict();
  dict.insert("k", randn({1, 1, 2, 2}));
  save(dict, no_q);
  CHECK_THROWS_WITH(open_capture(no_q)->load(0), ContainsSubstring(no_q) && ContainsSubstring("field 'q'"));
}

TEST_CASE("pt: an aiter folder is ordered by call_idx, applies kwargs and skips _metadata.pt") {
  TempDir dir("pt-aiter");
  // File names sort as 000003 < 10 < 2; call_idx orders them 2 (0), 10 (1), 000003 (5).
  save(aiter_call(0, true, std::nullopt), dir.file("x_input_2.pt"));
  save(aiter_call(1, false, 0.25), dir.file("x_input_10.pt"));
  save(aiter_call(5, true, 0.125), dir.file("x_input_000003.pt"));
  Dict summary = new_dict();  // aiter's summary: not a call, and unreadable as one
  summary.insert("num_calls", int64_t{3});
  save(summary, dir.file("x_metadata.pt"));

  auto source = open_capture(dir.path().string());
  CHECK(source->format() == "pt-folder");
  CHECK(source->open_errors().empty());
  REQUIRE(source->size() == 3);
  const AttentionCall first = source->load(0), second = source->load(1), third = source->load(2);
  CHECK(first.source == dir.file("x_input_2.pt"));
  CHECK(second.source == dir.file("x_input_10.pt"));
  CHECK(third.source == dir.file("x_input_000003.pt"));
  CHECK(first.call_index == 0);
  CHECK(second.call_index == 1);
  CHECK(third.call_index == 5);
  CHECK(first.is_causal);
  CHECK_FALSE(first.scale.has_value());
  CHECK_FALSE(second.is_causal);
  CHECK(second.scale == 0.25);
  CHECK(third.is_causal);
  CHECK(third.scale == 0.125);
  CHECK(first.op == "x");  // aiter records no op: the kernel name from the file name stands in
  CHECK(first.metadata.at("kwargs.backend_hint") == "ck");
}

TEST_CASE("pt: an unreadable file in a folder is reported, the rest still load") {
  TempDir dir("pt-folder-bad");
  save(aiter_call(0, false, std::nullopt), dir.file("y_input_0.pt"));
  std::ofstream(dir.file("y_input_1.pt"), std::ios::binary) << "garbage";
  save(aiter_call(2, false, std::nullopt), dir.file("y_input_2.pt"));
  auto source = open_capture(dir.path().string());
  REQUIRE(source->size() == 2);
  REQUIRE(source->open_errors().size() == 1);
  CHECK_THAT(source->open_errors()[0], ContainsSubstring("y_input_1.pt"));
  CHECK(source->load(1).call_index == 2);
}

TEST_CASE("pt: write_pt_tensors writes a dict torch can read back") {
  TempDir dir("pt-tensors");
  std::mt19937_64 rng(3);
  const HostTensor out = random_tensor(DType::float16, {1, 2, 3, 4}, rng);
  const std::string path = dir.file("out.pt");
  write_pt_tensors({{"out", out}}, {{"kernel", "torch-math-cpu"}}, path);
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  const c10::IValue root = torch::jit::pickle_load(bytes);
  REQUIRE(root.isGenericDict());
  const Dict dict = root.toGenericDict();
  CHECK(dict.at("kernel").toStringRef() == "torch-math-cpu");
  const at::Tensor tensor = dict.at("out").toTensor();
  CHECK(tensor.scalar_type() == at::kHalf);
  CHECK(tensor.sizes().vec() == out.shape);
  CHECK(std::memcmp(tensor.data_ptr(), out.data(), out.nbytes()) == 0);
}
