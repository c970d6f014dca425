// Error statistics against the reference (replay/error_stats.cpp), on tensors small enough to
// work out every figure by hand.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "formats/errors.h"
#include "replay/error_stats.h"

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
