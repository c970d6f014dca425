// The exact fp64 reference (kernels/reference.cpp) against cases worked by hand, and against
// torch's math backend in double precision.
#include <ATen/ATen.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "formats/torch_tensor.h"
#include "kernels/reference.h"
#include "replay/run/generate.h"

using namespace attnreplay;
using Catch::Matchers::WithinAbs;

namespace {

HostTensor f64(std::vector<std::int64_t> shape, std::vector<double> values) {
  return HostTensor::from_doubles(DType::float64, std::move(shape), values);
}

HostTensor filled(std::vector<std::int64_t> shape, double value) {
  std::int64_t count = 1;
  for (auto d : shape) count *= d;
  return f64(std::move(shape), std::vector<double>(static_cast<std::size_t>(count), value));
}

// One batch, one head: q (sq x d), k (skv x d), v (skv x dv).
AttentionCall single_head(std::int64_t sq, std::int64_t skv, std::vector<double> q, std::vector<double> k,
                          std::vector<double> v, std::int64_t d, std::int64_t dv) {
  AttentionCall call;
  call.q = f64({1, 1, sq, d}, std::move(q));
  call.k = f64({1, 1, skv, d}, std::move(k));
  call.v = f64({1, 1, skv, dv}, std::move(v));
  call.scale = 1.0;
  return call;
}

constexpr double kTight = 1e-15;

}  // namespace

TEST_CASE("reference: one query over two keys is the hand-computed softmax average") {
  // Scores q*k = [0, 1]; weights [1, e] / (1 + e); values [1, 3].
  const AttentionCall call = single_head(1, 2, {1.0}, {0.0, 1.0}, {1.0, 3.0}, 1, 1);
  const ReferenceOutput out = reference_attention(call);
  const double e = std::exp(1.0);
  REQUIRE(out.values.size() == 1);
  CHECK_THAT(out.values[0], WithinAbs((1.0 + 3.0 * e) / (1.0 + e), kTight));
  CHECK(out.fully_masked_rows == 0);
  CHECK_FALSE(out.sampled);
  CHECK(out.rows == std::vector<std::int64_t>{0});
}

TEST_CASE("reference: the default scale is 1/sqrt(d_qk)") {
  // d = 4, q = k1 = [1,1,1,1], k0 = 0: the dot is 4, scaled by 1/2 gives 2.
  AttentionCall call = single_head(1, 2, {1, 1, 1, 1}, {0, 0, 0, 0, 1, 1, 1, 1}, {0.0, 1.0}, 4, 1);
  call.scale.reset();
  const double w = std::exp(2.0) / (1.0 + std::exp(2.0));
  CHECK_THAT(reference_attention(call).values[0], WithinAbs(w, kTight));
}

TEST_CASE("reference: bool masks broadcast and false means excluded") {
  // 2 queries, 3 keys, all scores 0 (q = 0): output is the mean of the allowed values.
  AttentionCall call = single_head(2, 3, {0, 0}, {1, 2, 3}, {1, 2, 4}, 1, 1);
  SECTION("a (skv) mask applies to every row") {
    call.mask = HostTensor::from_doubles(DType::boolean, {3}, std::vector<double>{1, 0, 1});
    const ReferenceOutput out = reference_attention(call);
    CHECK_THAT(out.values[0], WithinAbs(2.5, kTight));
    CHECK_THAT(out.values[1], WithinAbs(2.5, kTight));
  }
  SECTION("a (sq, skv) mask differs per row") {
    call.mask = HostTensor::from_doubles(DType::boolean, {1, 1, 2, 3}, std::vector<double>{1, 1, 0, 0, 0, 1});
    const ReferenceOutput out = reference_attention(call);
    CHECK_THAT(out.values[0], WithinAbs(1.5, kTight));
    CHECK_THAT(out.values[1], WithinAbs(4.0, kTight));
  }
  SECTION("a (sq, 1) mask broadcasts over keys") {
    call.mask = HostTensor::from_doubles(DType::boolean, {2, 1}, std::vector<double>{1, 0});
    const ReferenceOutput out = reference_attention(call);
    CHECK_THAT(out.values[0], WithinAbs(7.0 / 3.0, kTight));
    CHECK(out.values[1] == 0.0);  // row 1 has no key left
    CHECK(out.fully_masked_rows == 1);
  }
}

TEST_CASE("reference: float masks are added to the scores, with broadcasting") {
  // Scores 0 plus mask [0, ln 2, -inf]: weights 1 : 2 : 0 over values 1, 2, 4.
  AttentionCall call = single_head(2, 3, {0, 0}, {1, 2, 3}, {1, 2, 4}, 1, 1);
  call.mask = HostTensor::from_doubles(DType::float32, {1, 3},
                                       std::vector<double>{0.0, std::log(2.0), -INFINITY});
  const ReferenceOutput out = reference_attention(call);
  // ln 2 rounded to float32 first: the stored mask is what the reference adds.
  const double ln2 = static_cast<double>(static_cast<float>(std::log(2.0)));
  const double w = std::exp(ln2);
  for (double value : out.values) CHECK_THAT(value, WithinAbs((1.0 + 2.0 * w) / (1.0 + w), kTight));
}

TEST_CASE("reference: a mask broadcast over batch and heads reaches every (b, h)") {
  // b=2, h=2: a (1, 1, 1, skv) mask with the first key off; q = 0, so each row averages keys 1..2.
  AttentionCall call;
  call.q = filled({2, 2, 1, 1}, 0.0);
  call.k = filled({2, 2, 3, 1}, 0.0);
  call.v = f64({2, 2, 3, 1}, {1, 2, 4, 10, 20, 40, 100, 200, 400, 1000, 2000, 4000});
  call.mask = HostTensor::from_doubles(DType::boolean, {1, 1, 1, 3}, std::vector<double>{0, 1, 1});
  const ReferenceOutput out = reference_attention(call);
  REQUIRE(out.values.size() == 4);
  CHECK_THAT(out.values[0], WithinAbs(3.0, kTight));
  CHECK_THAT(out.values[1], WithinAbs(30.0, kTight));
  CHECK_THAT(out.values[2], WithinAbs(300.0, 1e-12));
  CHECK_THAT(out.values[3], WithinAbs(3000.0, 1e-12));
}

TEST_CASE("reference: causal top-left and bottom-right differ when s_q != s_kv") {
  // 2 queries, 3 keys, q = 0 (equal scores): each row is the mean of the keys it may see.
  AttentionCall call = single_head(2, 3, {0, 0}, {1, 2, 3}, {1, 2, 4}, 1, 1);
  call.is_causal = true;
  SECTION("top-left: row i sees keys 0..i") {
    call.causal_alignment = CausalAlignment::top_left;
    const ReferenceOutput out = reference_attention(call);
    CHECK_THAT(out.values[0], WithinAbs(1.0, kTight));
    CHECK_THAT(out.values[1], WithinAbs(1.5, kTight));
  }
  SECTION("bottom-right: row i sees keys 0..i + (s_kv - s_q)") {
    call.causal_alignment = CausalAlignment::bottom_right;
    const ReferenceOutput out = reference_attention(call);
    CHECK_THAT(out.values[0], WithinAbs(1.5, kTight));
    CHECK_THAT(out.values[1], WithinAbs(7.0 / 3.0, kTight));
  }
}

TEST_CASE("reference: bottom-right with more queries than keys leaves the first rows with no key") {
  // 3 queries, 2 keys: row 0 sees none (output 0, counted), row 1 sees key 0, row 2 both.
  AttentionCall call = single_head(3, 2, {0, 0, 0}, {1, 2}, {2, 6}, 1, 1);
  call.is_causal = true;
  call.causal_alignment = CausalAlignment::bottom_right;
  const ReferenceOutput out = reference_attention(call);
  CHECK(out.values[0] == 0.0);
  CHECK_THAT(out.values[1], WithinAbs(2.0, kTight));
  CHECK_THAT(out.values[2], WithinAbs(4.0, kTight));
  CHECK(out.fully_masked_rows == 1);
}

TEST_CASE("reference: GQA query head h reads kv head h / (hq / hkv)") {
  // 4 query heads over 2 kv heads; kv head 0's values are all 1, kv head 1's all 5. With q = 0
  // each output is its kv head's value: 1, 1, 5, 5 (an h % hkv mapping would give 1, 5, 1, 5).
  AttentionCall call;
  call.q = filled({1, 4, 2, 3}, 0.0);
  call.k = filled({1, 2, 3, 3}, 0.5);
  std::vector<double> values(2 * 3 * 2);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = i < 6 ? 1.0 : 5.0;
  call.v = f64({1, 2, 3, 2}, values);
  const ReferenceOutput out = reference_attention(call);
  REQUIRE(out.values.size() == 4 * 2 * 2);
  for (std::int64_t h = 0; h < 4; ++h)
    for (std::size_t row = 0; row < 2; ++row)
      for (std::int64_t d = 0; d < 2; ++d) CHECK_THAT(out.at(0, h, row, d), WithinAbs(h < 2 ? 1.0 : 5.0, kTight));
}

TEST_CASE("reference: every key masked gives 0 and is counted per (batch, head, row)") {
  AttentionCall call;
  call.q = filled({2, 3, 2, 4}, 1.0);
  call.k = filled({2, 3, 5, 4}, 1.0);
  call.v = filled({2, 3, 5, 4}, 7.0);
  // Row 1 of every (b, h) has no allowed key; row 0 has all of them.
  call.mask = HostTensor::from_doubles(DType::boolean, {2, 5}, std::vector<double>{1, 1, 1, 1, 1, 0, 0, 0, 0, 0});
  const ReferenceOutput out = reference_attention(call, {}, 3);
  CHECK(out.fully_masked_rows == 2 * 3);
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < 3; ++h)
      for (std::int64_t d = 0; d < 4; ++d) {
        CHECK_THAT(out.at(b, h, 0, d), WithinAbs(7.0, kTight));
        CHECK(out.at(b, h, 1, d) == 0.0);
      }
  // An additive float mask of -inf everywhere is the same.
  call.mask = filled({1}, -INFINITY);
  CHECK(reference_attention(call).fully_masked_rows == 2 * 3 * 2);
}

TEST_CASE("reference: d_vo may differ from d_qk") {
  // d_qk = 2, d_vo = 3. q = [1, 0]; keys [0, 0] and [ln 3, 0]: scores 0 and ln 3, weights 1/4, 3/4.
  const AttentionCall call =
      single_head(1, 2, {1, 0}, {0, 0, std::log(3.0), 0}, {4, 8, 0, 0, 4, 8}, 2, 3);
  const ReferenceOutput out = reference_attention(call);
  REQUIRE(out.shape.head_dim_vo == 3);
  REQUIRE(out.values.size() == 3);
  CHECK_THAT(out.values[0], WithinAbs(1.0, 1e-14));
  CHECK_THAT(out.values[1], WithinAbs(5.0, 1e-14));
  CHECK_THAT(out.values[2], WithinAbs(6.0, 1e-14));
}

TEST_CASE("reference: bshd inputs give the same result as their bhsd transpose") {
  GeneratedCallSpec spec;
  spec.shape = {2, 4, 2, 7, 9, 8, 8};
  spec.dtype = DType::float32;
  spec.layout = Layout::bhsd;
  spec.seed = 11;
  const AttentionCall bhsd = generate_call(spec);
  AttentionCall bshd = bhsd;
  bshd.layout = Layout::bshd;
  for (HostTensor* t : {&bshd.q, &bshd.k, &bshd.v}) {
    // (b, h, s, d) -> (b, s, h, d), through torch to stay independent of to_bhsd.
    const at::Tensor moved = torch_from_host_tensor(*t).transpose(1, 2).contiguous();
    *t = host_tensor_from_torch(moved);
  }
  const ReferenceOutput a = reference_attention(bhsd), b = reference_attention(bshd);
  CHECK(a.values == b.values);
}

TEST_CASE("reference: sampled rows equal the same rows of the full computation") {
  GeneratedCallSpec spec;
  spec.shape = {2, 4, 2, 40, 33, 16, 8};
  spec.dtype = DType::bfloat16;
  spec.is_causal = true;
  spec.seed = 5;
  const AttentionCall call = generate_call(spec);
  const ReferenceOutput full = reference_attention(call, {}, 2);
  const std::vector<std::int64_t> rows = sample_query_rows(40, 7, 123);
  REQUIRE(rows.size() == 7);
  CHECK(std::is_sorted(rows.begin(), rows.end()));
  CHECK(std::adjacent_find(rows.begin(), rows.end()) == rows.end());
  CHECK(rows == sample_query_rows(40, 7, 123));  // the seed fixes the draw
  const ReferenceOutput sampled = reference_attention(call, rows, 3);
  CHECK(sampled.sampled);
  CHECK(sampled.rows == rows);
  REQUIRE(sampled.values.size() == static_cast<std::size_t>(2 * 4 * 7 * 8));
  int different = 0;
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < 4; ++h)
      for (std::size_t slot = 0; slot < rows.size(); ++slot)
        for (std::int64_t d = 0; d < 8; ++d)
          if (sampled.at(b, h, slot, d) != full.at(b, h, static_cast<std::size_t>(rows[slot]), d)) ++different;
  CHECK(different == 0);
  // Asking for all rows (or more) is not sampling.
  CHECK(sample_query_rows(5, 9, 1) == std::vector<std::int64_t>{0, 1, 2, 3, 4});
}

TEST_CASE("reference: agrees with torch's math backend in fp64 (GQA, causal) to 1e-12") {
  at::manual_seed(20240601);
  const auto options = at::TensorOptions().dtype(at::kDouble);
  // (batch 2, 4 query heads, 33 queries, d 17) over 2 kv heads.
  const at::Tensor q = at::randn({2, 4, 33, 17}, options);
  const at::Tensor k = at::randn({2, 2, 33, 17}, options);
  const at::Tensor v = at::randn({2, 2, 33, 17}, options);
  const at::Tensor expected = std::get<0>(at::_scaled_dot_product_attention_math(
      q, k, v, std::nullopt, 0.0, /*is_causal=*/true, std::nullopt, std::nullopt, /*enable_gqa=*/true));

  AttentionCall call;
  call.q = host_tensor_from_torch(q);
  call.k = host_tensor_from_torch(k);
  call.v = host_tensor_from_torch(v);
  call.is_causal = true;
  call.enable_gqa = true;
  const ReferenceOutput out = reference_attention(call);
  REQUIRE(out.values.size() == static_cast<std::size_t>(expected.numel()));
  const at::Tensor ours = at::from_blob(const_cast<double*>(out.values.data()), expected.sizes(), options);
  const double max_diff = (ours - expected).abs().max().item<double>();
  CHECK(max_diff < 1e-12);
  // And the comparison can fail: the non-causal result is far from it.
  const ReferenceOutput full = [&] {
    AttentionCall other = call;
    other.is_causal = false;
    return reference_attention(other);
  }();
  const at::Tensor ours_full = at::from_blob(const_cast<double*>(full.values.data()), expected.sizes(), options);
  CHECK((ours_full - expected).abs().max().item<double>() > 1e-3);
}
