// Error statistics against the reference (replay/judge/compare.cpp), on tensors small enough to
// work out every figure by hand.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "formats/errors.h"
#include "replay/judge/compare.h"

using namespace attnreplay;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;

namespace {

// A reference of shape (b, h, sq, dvo) over `rows` (all rows when empty).
ReferenceOutput make_reference(std::int64_t b, std::int64_t h, std::int64_t sq, std::int64_t dvo,
                               std::vector<double> values, std::vector<std::int64_t> rows = {}) {
  ReferenceOutput r;
  r.shape = {b, h, h, sq, sq, dvo, dvo};
  r.sampled = !rows.empty();
  if (rows.empty()) {
    for (std::int64_t i = 0; i < sq; ++i) rows.push_back(i);
  }
  r.rows = std::move(rows);
  r.values = std::move(values);
  return r;
}

HostTensor f64(std::vector<std::int64_t> shape, std::vector<double> values) {
  return HostTensor::from_doubles(DType::float64, std::move(shape), values);
}

constexpr double kEps = 1e-15;

}  // namespace

TEST_CASE("error stats: every figure on a 2x2 case worked by hand") {
  // r = [1, 2, 3, 4], o = [1.5, 2, 2, 4]: e = [0.5, 0, 1, 0].
  const ReferenceOutput ref = make_reference(1, 1, 2, 2, {1, 2, 3, 4});
  const HostTensor out = f64({1, 1, 2, 2}, {1.5, 2, 2, 4});
  const ErrorStats s = compare_to_reference(out, ref);
  CHECK(s.elements == 4);
  CHECK(s.rows_compared == 2);
  CHECK_FALSE(s.sampled);
  CHECK(s.max_abs == 1.0);
  CHECK(s.worst_row == 1);  // the error of 1 sits at row 1, channel 0
  CHECK(s.worst_channel == 0);
  CHECK_THAT(s.mean_abs, WithinAbs(0.375, kEps));
  CHECK_THAT(s.mse, WithinAbs(1.25 / 4, kEps));
  CHECK_THAT(s.rmse, WithinAbs(std::sqrt(1.25 / 4), kEps));
  // Population std of [0.5, 0, 1, 0] around 0.375: sqrt(0.6875 / 4).
  CHECK_THAT(s.std_abs, WithinAbs(std::sqrt(0.6875 / 4), kEps));
  CHECK_THAT(s.rel_l1, WithinAbs(1.5 / 10, kEps));
  CHECK_THAT(s.rel_l2, WithinAbs(std::sqrt(1.25 / 30), kEps));
  // <o, r> = 1.5 + 4 + 6 + 16; |o|^2 = 2.25 + 4 + 4 + 16; |r|^2 = 30.
  CHECK_THAT(s.cosine, WithinAbs(27.5 / (std::sqrt(26.25) * std::sqrt(30.0)), kEps));
  CHECK(s.nan_count == 0);
  CHECK(s.inf_count == 0);
  // Moments, population std.
  CHECK(s.output.min == 1.5);
  CHECK(s.output.max == 4.0);
  CHECK_THAT(s.output.mean, WithinAbs(9.5 / 4, kEps));
  CHECK_THAT(s.output.std, WithinAbs(std::sqrt((0.875 * 0.875 + 0.375 * 0.375 * 2 + 1.625 * 1.625) / 4), kEps));
  CHECK(s.reference.min == 1.0);
  CHECK(s.reference.max == 4.0);
  CHECK_THAT(s.reference.mean, WithinAbs(2.5, kEps));
  CHECK_THAT(s.reference.std, WithinAbs(std::sqrt(1.25), kEps));
}

TEST_CASE("error stats: the worst element is located in (batch, head, row, channel)") {
  // b=2, h=3, sq=2, d=2: every element off by 0.01 except (1, 2, 0, 1), off by 0.5.
  std::vector<double> r(2 * 3 * 2 * 2), o(r.size());
  for (std::size_t i = 0; i < r.size(); ++i) {
    r[i] = static_cast<double>(i) * 0.25 - 1.0;
    o[i] = r[i] + 0.01;
  }
  const std::size_t worst = ((1 * 3 + 2) * 2 + 0) * 2 + 1;
  o[worst] = r[worst] - 0.5;
  const ErrorStats s = compare_to_reference(f64({2, 3, 2, 2}, o), make_reference(2, 3, 2, 2, r));
  CHECK_THAT(s.max_abs, WithinAbs(0.5, 1e-12));
  CHECK(s.worst_batch == 1);
  CHECK(s.worst_head == 2);
  CHECK(s.worst_row == 0);
  CHECK(s.worst_channel == 1);
}

TEST_CASE("error stats: NaN and Inf outputs are counted and left out of every other figure") {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  // Same as the hand-worked case, with two more elements that are NaN and -Inf.
  const ReferenceOutput ref = make_reference(1, 1, 3, 2, {1, 2, 3, 4, 5, 6});
  const ErrorStats s = compare_to_reference(f64({1, 1, 3, 2}, {1.5, 2, 2, 4, nan, -inf}), ref);
  CHECK(s.nan_count == 1);
  CHECK(s.inf_count == 1);
  CHECK(s.elements == 4);
  CHECK(s.max_abs == 1.0);
  CHECK_THAT(s.mean_abs, WithinAbs(0.375, kEps));
  CHECK_THAT(s.rel_l1, WithinAbs(0.15, kEps));  // the reference's 5 and 6 are excluded too
  CHECK(std::isfinite(s.cosine));
  CHECK(s.output.max == 4.0);
  CHECK(s.reference.max == 4.0);
}

TEST_CASE("error stats: a reference that is not finite (inputs holding NaN) makes every error figure NaN") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const ReferenceOutput ref = make_reference(1, 1, 2, 2, {1, 3, nan, 4});
  const ErrorStats s = compare_to_reference(f64({1, 1, 2, 2}, {1, 2, 3, 4}), ref);
  CHECK(s.elements == 4);  // the output is finite everywhere
  CHECK(s.nan_count == 0);
  for (const double figure : {s.max_abs, s.mean_abs, s.mse, s.rmse, s.std_abs, s.rel_l1, s.rel_l2, s.cosine, s.max_rel}) {
    CHECK(std::isnan(figure));  // none reads as a small error
  }
  CHECK(s.worst_row == 1);  // the reference's first NaN
  CHECK(s.worst_channel == 0);
  CHECK(s.output.max == 4.0);
  CHECK(std::isnan(s.reference.mean));
}

TEST_CASE("error stats: identical tensors give zero error and cosine 1") {
  const std::vector<double> values{0.5, -1.25, 3, 7, -2, 0.125};
  const ErrorStats s = compare_to_reference(f64({1, 1, 3, 2}, values), make_reference(1, 1, 3, 2, values));
  CHECK(s.max_abs == 0.0);
  CHECK(s.mean_abs == 0.0);
  CHECK(s.mse == 0.0);
  CHECK(s.rmse == 0.0);
  CHECK(s.std_abs == 0.0);
  CHECK(s.rel_l1 == 0.0);
  CHECK(s.rel_l2 == 0.0);
  CHECK_THAT(s.cosine, WithinAbs(1.0, kEps));
  // Both all-zero: cosine is 1 by definition, not 0/0.
  const ErrorStats zeros = compare_to_reference(f64({1, 1, 1, 2}, {0, 0}), make_reference(1, 1, 1, 2, {0, 0}));
  CHECK(zeros.cosine == 1.0);
  CHECK(zeros.rel_l2 == 0.0);
  // Output zero against a non-zero reference: cosine 0, every bit of the reference is error.
  const ErrorStats off = compare_to_reference(f64({1, 1, 1, 2}, {0, 0}), make_reference(1, 1, 1, 2, {3, 4}));
  CHECK(off.cosine == 0.0);
  CHECK(off.rel_l2 == 1.0);
  CHECK(off.rel_l1 == 1.0);
}

TEST_CASE("error stats: a sampled reference compares only its rows, reported by row index") {
  // seq_q 3, only rows 0 and 2 computed; row 1 of the output is garbage that must be ignored.
  const ReferenceOutput ref = make_reference(1, 1, 3, 1, {1, 3}, {0, 2});
  const ErrorStats s = compare_to_reference(f64({1, 1, 3, 1}, {1, 1000, 3.5}), ref);
  CHECK(s.sampled);
  CHECK(s.rows_compared == 2);
  CHECK(s.elements == 2);
  CHECK(s.max_abs == 0.5);
  CHECK(s.worst_row == 2);
}

TEST_CASE("error stats: the output is read in its own dtype") {
  // bf16 cannot hold 1 + 2^-9: stored as 1, so the error is 2^-9 against that reference.
  const double fine = 1.0 + std::ldexp(1.0, -9);
  const HostTensor out = HostTensor::from_doubles(DType::bfloat16, {1, 1, 1, 1}, std::vector<double>{fine});
  const ErrorStats s = compare_to_reference(out, make_reference(1, 1, 1, 1, {fine}));
  CHECK(s.max_abs == std::ldexp(1.0, -9));
}

TEST_CASE("error stats: an output of the wrong shape is an InputError") {
  using Catch::Matchers::ContainsSubstring;
  CHECK_THROWS_AS(compare_to_reference(f64({1, 1, 2, 1}, {0, 0}), make_reference(1, 1, 1, 2, {0, 0})), InputError);
  CHECK_THROWS_WITH(compare_to_reference(f64({1, 1, 2, 1}, {0, 0}), make_reference(1, 1, 1, 2, {0, 0})),
                    ContainsSubstring("1x1x2x1") && ContainsSubstring("1x1x1x2"));
}

namespace {

// Head (b, h) of a (batch, heads, seq, dim) float64 tensor, as a (1, 1, seq, dim) tensor.
HostTensor head_slice(const std::vector<double>& values, std::int64_t heads, std::int64_t seq, std::int64_t dim,
                      std::int64_t b, std::int64_t h) {
  const auto begin = values.begin() + ((b * heads + h) * seq * dim);
  return f64({1, 1, seq, dim}, std::vector<double>(begin, begin + seq * dim));
}

}  // namespace

TEST_CASE("per-head errors: each (batch, head) equals compare_to_reference on that head alone") {
  // b=2, h=3, sq=4, d=2, each head off by a different amount, one head with a NaN and one sampled
  // reference: the per-head figures must follow the whole-tensor definitions on one-head slices.
  const std::int64_t b = 2, h = 3, sq = 4, d = 2;
  std::vector<double> r(static_cast<std::size_t>(b * h * sq * d)), o(r.size());
  for (std::size_t i = 0; i < r.size(); ++i) {
    r[i] = std::sin(0.7 * static_cast<double>(i)) + 0.1;
    const auto head = static_cast<double>(i / static_cast<std::size_t>(sq * d));
    o[i] = r[i] * (1 + 0.01 * head) + 0.003 * std::cos(static_cast<double>(i));
  }
  o[((1 * h + 2) * sq + 1) * d] = std::numeric_limits<double>::quiet_NaN();
  for (const std::vector<std::int64_t>& rows : {std::vector<std::int64_t>{}, std::vector<std::int64_t>{1, 3}}) {
    INFO("sampled rows: " << rows.size());
    ReferenceOutput whole = make_reference(b, h, sq, d, {}, rows);
    for (std::int64_t bb = 0; bb < b; ++bb)
      for (std::int64_t hh = 0; hh < h; ++hh)
        for (const std::int64_t row : whole.rows)
          for (std::int64_t c = 0; c < d; ++c) whole.values.push_back(r[static_cast<std::size_t>(((bb * h + hh) * sq + row) * d + c)]);
    const std::vector<HeadError> heads = compare_per_head(f64({b, h, sq, d}, o), whole);
    REQUIRE(heads.size() == static_cast<std::size_t>(b * h));
    for (std::int64_t bb = 0; bb < b; ++bb)
      for (std::int64_t hh = 0; hh < h; ++hh) {
        const HeadError& got = heads[static_cast<std::size_t>(bb * h + hh)];
        ReferenceOutput one = make_reference(1, 1, sq, d, {}, rows);
        for (const std::int64_t row : one.rows)
          for (std::int64_t c = 0; c < d; ++c) one.values.push_back(r[static_cast<std::size_t>(((bb * h + hh) * sq + row) * d + c)]);
        const ErrorStats want = compare_to_reference(head_slice(o, h, sq, d, bb, hh), one);
        CHECK(got.batch == bb);
        CHECK(got.head == hh);
        CHECK_THAT(got.rel_l2, WithinRel(want.rel_l2, 1e-12));
        CHECK_THAT(got.cosine, WithinAbs(want.cosine, 1e-15));
        CHECK(got.max_abs == want.max_abs);
        CHECK(got.nonfinite_count == want.nan_count + want.inf_count);
      }
    // The NaN sits in row 1 of (1, 2): counted there when row 1 is compared, nowhere else.
    CHECK(heads[5].nonfinite_count == 1);
    CHECK(heads[0].nonfinite_count == 0);
  }
}

TEST_CASE("per-head errors: a head whose reference is not finite reads NaN in every figure, as the call does") {
  // 1 batch, 2 heads of 2 rows x 2; head 1's reference holds a NaN (inputs that held one).
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> r{1, 2, 3, 4, 1, nan, 3, 4};
  const std::vector<double> o{1.5, 2, 3, 4, 1, 2, 3, 5};
  const ReferenceOutput ref = make_reference(1, 2, 2, 2, r);
  const std::vector<HeadError> heads = compare_per_head(f64({1, 2, 2, 2}, o), ref);
  REQUIRE(heads.size() == 2);
  CHECK(heads[0].max_abs == 0.5);
  CHECK_THAT(heads[0].rel_l2, WithinRel(0.5 / std::sqrt(30.0), 1e-12));
  CHECK(std::isnan(heads[1].max_abs));  // its finite errors (1 at the end) are no figure of a NaN reference
  CHECK(std::isnan(heads[1].rel_l2));
  CHECK(std::isnan(heads[1].cosine));
  CHECK(heads[1].nonfinite_count == 0);
  CHECK(std::isnan(compare_to_reference(f64({1, 2, 2, 2}, o), ref).max_abs));
}

TEST_CASE("per-head errors: a head that is far off stands out where the whole tensor averages it away") {
  // 1 batch, 4 heads of 8 values; head 2 is scaled by 1.2, the others are exact.
  std::vector<double> r(32), o(32);
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = o[i] = 1.0 + 0.25 * static_cast<double>(i % 5);
  for (std::size_t i = 16; i < 24; ++i) o[i] *= 1.2;
  const ReferenceOutput ref = make_reference(1, 4, 4, 2, r);
  const std::vector<HeadError> heads = compare_per_head(f64({1, 4, 4, 2}, o), ref);
  REQUIRE(heads.size() == 4);
  CHECK(heads[0].rel_l2 == 0.0);
  CHECK_THAT(heads[2].rel_l2, WithinAbs(0.2, 1e-12));  // ||0.2 r|| / ||r||
  CHECK_THAT(heads[2].cosine, WithinAbs(1.0, 1e-12));   // a scaled head still points the same way
  CHECK(compare_to_reference(f64({1, 4, 4, 2}, o), ref).rel_l2 < 0.2);
  CHECK_THROWS_AS(compare_per_head(f64({1, 4, 2, 4}, o), ref), InputError);
}

TEST_CASE("error stats: rows that see no key are left out of every judging figure; the whole call's stand beside") {
  // b=1, h=2, sq=2, d=2; row 1 of head 0 sees no key, and the kernel wrote NaN and a large value there.
  const ReferenceOutput plain = make_reference(1, 2, 2, 2, {1, 2, 0, 0, 3, 4, 5, 6});
  ReferenceOutput ref = plain;
  ref.no_key = {0, 1, 0, 0};
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const HostTensor out = f64({1, 2, 2, 2}, {1.5, 2, nan, 7, 3, 4, 5, 5});
  const ErrorStats s = compare_to_reference(out, ref);
  // Judged: (1.5, 2, 3, 4, 5, 5) against (1, 2, 3, 4, 5, 6): errors 0.5 and 1.
  CHECK(s.no_key_rows == 1);
  CHECK(s.elements == 6);
  CHECK(s.nan_count == 0);
  CHECK(s.max_abs == 1.0);
  CHECK(s.worst_head == 1);
  CHECK(s.worst_row == 1);
  CHECK(s.worst_channel == 1);
  CHECK_THAT(s.rel_l2, WithinAbs(std::sqrt(1.25 / (1 + 4 + 9 + 16 + 25 + 36)), kEps));
  CHECK_THAT(s.mean_abs, WithinAbs(1.5 / 6, kEps));
  // Beside them, every row: the NaN is counted and the 7 against 0 is the worst error.
  REQUIRE(s.including_rows_without_a_key);
  const ErrorFigures& whole = *s.including_rows_without_a_key;
  CHECK(whole.nan_count == 1);
  CHECK(whole.elements == 7);
  CHECK(whole.max_abs == 7.0);
  CHECK(whole.worst_head == 0);
  CHECK(whole.worst_row == 1);
  CHECK(whole.rel_l2 > s.rel_l2);
  // Without marks, nothing is left out and nothing stands beside.
  const ErrorStats unmarked = compare_to_reference(out, plain);
  CHECK_FALSE(unmarked.including_rows_without_a_key);
  CHECK(unmarked.max_abs == 7.0);
  // Per head, the same rows are left out.
  const auto heads = compare_per_head(out, ref);
  REQUIRE(heads.size() == 2);
  CHECK(heads[0].nonfinite_count == 0);
  CHECK(heads[0].max_abs == 0.5);
  CHECK(heads[1].max_abs == 1.0);
}
