// AttentionCall's shape checks (formats/attention_call.cpp): every inconsistency is an InputError
// that names the call and the field, and to_bhsd moves data to (b, h, s, d) correctly.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "formats/attention_call.h"
#include "formats/errors.h"

using namespace attnreplay;
using Catch::Matchers::ContainsSubstring;

namespace {

// A tensor whose element i holds the value i, so positions can be checked after a transpose.
HostTensor iota_tensor(std::vector<std::int64_t> shape, DType dtype = DType::float32) {
  std::int64_t count = 1;
  for (auto d : shape) count *= d;
  std::vector<double> values(static_cast<std::size_t>(count));
  std::iota(values.begin(), values.end(), 0.0);
  return HostTensor::from_doubles(dtype, std::move(shape), values);
}

// b=2, hq=4, hkv=2, sq=3, skv=5, d=8 (v: 6), in the given layout.
AttentionCall make_call(Layout layout) {
  AttentionCall call;
  call.call_index = 7;
  call.source = "run.h5";
  call.layout = layout;
  auto dims = [layout](std::int64_t h, std::int64_t s, std::int64_t d) -> std::vector<std::int64_t> {
    return layout == Layout::bhsd ? std::vector<std::int64_t>{2, h, s, d} : std::vector<std::int64_t>{2, s, h, d};
  };
  call.q = iota_tensor(dims(4, 3, 8));
  call.k = iota_tensor(dims(2, 5, 8));
  call.v = iota_tensor(dims(2, 5, 6));
  return call;
}

}  // namespace

TEST_CASE("shape() reads both layouts into (b, hq, hkv, sq, skv, dqk, dvo)") {
  const AttentionShape want{2, 4, 2, 3, 5, 8, 6};
  CHECK(make_call(Layout::bhsd).shape() == want);
  CHECK(make_call(Layout::bshd).shape() == want);
  CHECK(make_call(Layout::bhsd).shape().is_gqa());
}

TEST_CASE("a k with 3 dims in bshd names the call and field 'k'") {
  AttentionCall call = make_call(Layout::bshd);
  call.k = iota_tensor({2, 5, 8});
  CHECK_THROWS_AS(call.shape(), InputError);
  CHECK_THROWS_WITH(call.shape(), ContainsSubstring("run.h5: call 7") && ContainsSubstring("field 'k'") &&
                                      ContainsSubstring("expected 4 dims"));
}

TEST_CASE("3-dim tensors are accepted in bhsd as (N, L, E), one head") {
  // SDPA's unbatched-heads form; bshd has no such form (previous test).
  AttentionCall call;
  call.q = iota_tensor({2, 3, 8});
  call.k = iota_tensor({2, 5, 8});
  call.v = iota_tensor({2, 5, 8});
  CHECK(call.shape() == AttentionShape{2, 1, 1, 3, 5, 8, 8});
}

TEST_CASE("mismatched q/k head dims are blamed on k") {
  AttentionCall call = make_call(Layout::bhsd);
  call.k = iota_tensor({2, 2, 5, 7});
  CHECK_THROWS_WITH(call.shape(), ContainsSubstring("call 7") && ContainsSubstring("field 'k'") &&
                                      ContainsSubstring("head dim 8"));
}

TEST_CASE("v's heads and sequence must match k's") {
  AttentionCall call = make_call(Layout::bhsd);
  call.v = iota_tensor({2, 2, 4, 6});
  CHECK_THROWS_WITH(call.shape(), ContainsSubstring("field 'v'") && ContainsSubstring("seq 5"));
  call.v = iota_tensor({2, 1, 5, 6});
  CHECK_THROWS_WITH(call.shape(), ContainsSubstring("field 'v'") && ContainsSubstring("2 heads"));
  call.v = iota_tensor({3, 2, 5, 6});
  CHECK_THROWS_WITH(call.shape(), ContainsSubstring("field 'v'") && ContainsSubstring("batch 2"));
}

TEST_CASE("kv heads that do not divide q heads are an error (GQA)") {
  AttentionCall call = make_call(Layout::bhsd);
  call.q = iota_tensor({2, 3, 3, 8});  // 3 query heads over 2 kv heads
  CHECK_THROWS_WITH(call.shape(), ContainsSubstring("call 7") && ContainsSubstring("field 'k'") &&
                                      ContainsSubstring("GQA"));
}

TEST_CASE("masks must broadcast to (b, hq, sq, skv)") {
  AttentionCall call = make_call(Layout::bhsd);
  // Broadcastable forms are accepted.
  for (std::vector<std::int64_t> shape : std::vector<std::vector<std::int64_t>>{
           {5}, {3, 5}, {1, 5}, {4, 3, 5}, {2, 1, 1, 5}, {2, 4, 3, 5}, {1, 1, 1, 1}}) {
    call.mask = iota_tensor(shape, DType::boolean);
    CHECK_NOTHROW(call.shape());
  }
  call.mask = iota_tensor({3, 4}, DType::boolean);  // seq_kv is 5
  CHECK_THROWS_WITH(call.shape(), ContainsSubstring("call 7") && ContainsSubstring("field 'mask'") &&
                                      ContainsSubstring("broadcastable"));
  call.mask = iota_tensor({2, 2, 3, 5}, DType::float32);  // 2 heads is neither 1 nor 4
  CHECK_THROWS_WITH(call.shape(), ContainsSubstring("field 'mask'"));
  call.mask = iota_tensor({1, 2, 4, 3, 5}, DType::float32);  // 5 dims
  CHECK_THROWS_WITH(call.shape(), ContainsSubstring("field 'mask'"));
  call.mask = iota_tensor({3, 5}, DType::int32);  // neither bool nor floating
  CHECK_THROWS_WITH(call.shape(), ContainsSubstring("field 'mask'") && ContainsSubstring("int32"));
}

TEST_CASE("out must be (b, hq, sq, dvo) in the call's layout") {
  AttentionCall call = make_call(Layout::bshd);
  call.out = iota_tensor({2, 3, 4, 6});
  CHECK_NOTHROW(call.shape());
  call.out = iota_tensor({2, 4, 3, 6});  // bhsd order in a bshd call
  CHECK_THROWS_WITH(call.shape(), ContainsSubstring("field 'out'"));
}

TEST_CASE("non-floating q, bad scale, bad dropout and short data are named") {
  AttentionCall call = make_call(Layout::bhsd);
  call.q = iota_tensor({2, 4, 3, 8}, DType::int32);
  CHECK_THROWS_WITH(call.shape(), ContainsSubstring("field 'q'") && ContainsSubstring("floating"));
  call = make_call(Layout::bhsd);
  call.scale = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH(call.shape(), ContainsSubstring("field 'scale'"));
  call = make_call(Layout::bhsd);
  call.dropout_p = 1.0;
  CHECK_THROWS_WITH(call.shape(), ContainsSubstring("field 'dropout_p'"));
  call = make_call(Layout::bhsd);
  call.v.bytes = std::make_shared<std::vector<std::byte>>(10);
  CHECK_THROWS_WITH(call.shape(), ContainsSubstring("field 'v'") && ContainsSubstring("bytes"));
  call = make_call(Layout::bhsd);
  call.k.shape[2] = 0;
  CHECK_THROWS_WITH(call.shape(), ContainsSubstring("field 'k'") && ContainsSubstring("positive"));
}

TEST_CASE("a call without a source is placed as <memory>") {
  AttentionCall call;
  call.call_index = 3;
  CHECK(call.where() == "<memory>: call 3");
}

TEST_CASE("softmax_scale defaults to 1/sqrt(d_qk)") {
  AttentionCall call = make_call(Layout::bhsd);
  CHECK(call.softmax_scale() == 1.0 / std::sqrt(8.0));
  call.scale = 0.5;
  CHECK(call.softmax_scale() == 0.5);
}

TEST_CASE("to_bhsd transposes bshd and keeps bhsd as is") {
  const HostTensor bshd = iota_tensor({2, 3, 4, 5});  // (b, s, h, d)
  const HostTensor bhsd = to_bhsd(bshd, Layout::bshd);
  REQUIRE(bhsd.shape == std::vector<std::int64_t>{2, 4, 3, 5});
  // Element (b, h, s, d) of the result is element (b, s, h, d) of the input, i.e. the value
  // ((b*3 + s)*4 + h)*5 + d.
  int wrong = 0;
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 4; ++h)
      for (int s = 0; s < 3; ++s)
        for (int d = 0; d < 5; ++d) {
          const double expect = ((b * 3 + s) * 4 + h) * 5 + d;
          if (bhsd.at(((b * 4 + h) * 3 + s) * 5 + d) != expect) ++wrong;
        }
  CHECK(wrong == 0);
  const HostTensor same = to_bhsd(bshd, Layout::bhsd);
  CHECK(same.shape == bshd.shape);
  CHECK(same.bytes == bshd.bytes);  // shared, not copied
  const HostTensor three = to_bhsd(iota_tensor({2, 3, 5}), Layout::bhsd);
  CHECK(three.shape == std::vector<std::int64_t>{2, 1, 3, 5});
}

TEST_CASE("layout and alignment names parse back") {
  CHECK(parse_layout(layout_name(Layout::bshd)) == Layout::bshd);
  CHECK(parse_layout("BHSD") == Layout::bhsd);
  CHECK_FALSE(parse_layout("bsdh").has_value());
  CHECK(parse_causal_alignment(causal_alignment_name(CausalAlignment::bottom_right)) == CausalAlignment::bottom_right);
  CHECK_FALSE(parse_causal_alignment("top-left").has_value());
}
