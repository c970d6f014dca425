// The one-pass comparison's folding (replay/judge/error_fold.h): what each GPU thread or CPU chunk
// folds and how partial sums merge, against the same figures computed directly, two passes where a
// spread is wanted. The e2e and GPU tests check whole comparisons against numpy's figures.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "replay/judge/error_fold.h"

using namespace attnreplay;
using Catch::Matchers::WithinRel;

namespace {

constexpr double kEpsilon = 1e-8, kTolerance = 1e-2;

struct Elements {
  std::vector<double> out, ref;
};

// Outputs near the reference with a few NaN and Inf.
Elements random_elements(std::size_t n, unsigned seed) {
  std::mt19937_64 generator(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Elements e;
  for (std::size_t i = 0; i < n; ++i) {
    const double r = normal(generator) + 0.3;
    double o = r + 0.02 * normal(generator);
    if (i % 97 == 5) o = std::numeric_limits<double>::quiet_NaN();
    if (i % 131 == 7) o = (i % 2 ? 1 : -1) * std::numeric_limits<double>::infinity();
    e.out.push_back(o);
    e.ref.push_back(r);
  }
  return e;
}

// As the GPU does it: `threads` interleaved shares, each folded in ascending index, then merged in
// `order`.
ErrorSums fold_in_shares(const Elements& e, int threads, const std::vector<int>& order) {
  std::vector<ErrorSums> shares(static_cast<std::size_t>(threads));
  for (std::size_t i = 0; i < e.out.size(); ++i) {
    fold(shares[i % threads], e.out[i], e.ref[i], static_cast<std::int64_t>(i), kEpsilon, kTolerance);
  }
  ErrorSums total;
  for (int t : order) merge(total, shares[static_cast<std::size_t>(t)]);
  return total;
}

std::vector<int> in_order(int threads) {
  std::vector<int> order(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) order[static_cast<std::size_t>(t)] = t;
  return order;
}

double mean_of(const std::vector<double>& x) {
  double sum = 0;
  for (double v : x) sum += v;
  return sum / static_cast<double>(x.size());
}

double m2_of(const std::vector<double>& x) {  // sum of squared deviations, two passes
  const double mean = mean_of(x);
  double sum = 0;
  for (double v : x) sum += (v - mean) * (v - mean);
  return sum;
}

}  // namespace

TEST_CASE("error sums: folded in interleaved shares and merged, every figure as computed directly") {
  const Elements e = random_elements(20011, 3);
  std::vector<double> errors, outputs, references;
  std::int64_t nan = 0, inf = 0, beyond = 0, worst = -1;
  double max_abs = -1, max_rel = 0, sum_e2 = 0, sum_abs_r = 0, sum_r2 = 0, sum_o2 = 0, sum_or = 0;
  for (std::size_t i = 0; i < e.out.size(); ++i) {
    const double o = e.out[i], r = e.ref[i];
    if (!std::isfinite(o)) {
      (std::isnan(o) ? nan : inf) += 1;
      continue;
    }
    const double error = std::fabs(o - r);
    errors.push_back(error), outputs.push_back(o), references.push_back(r);
    if (error > max_abs) max_abs = error, worst = static_cast<std::int64_t>(i);
    const double relative = error / (std::fabs(r) + kEpsilon);
    max_rel = std::max(max_rel, relative);
    beyond += error > kTolerance && relative > kTolerance;
    sum_e2 += error * error, sum_abs_r += std::fabs(r), sum_r2 += r * r, sum_o2 += o * o, sum_or += o * r;
  }
  REQUIRE(nan > 0);
  REQUIRE(inf > 0);

  for (const int threads : {1, 7, 256}) {
    std::vector<int> reversed = in_order(threads);
    std::reverse(reversed.begin(), reversed.end());
    for (const auto& order : {in_order(threads), reversed}) {
      const ErrorSums s = fold_in_shares(e, threads, order);
      CHECK(s.finite == static_cast<std::int64_t>(errors.size()));
      CHECK(s.nan == nan);
      CHECK(s.inf == inf);
      CHECK(s.beyond_tolerance == beyond);
      CHECK(s.reference_nonfinite == 0);
      CHECK(s.first_reference_nonfinite == -1);
      CHECK(s.worst_index == worst);
      CHECK(s.max_abs == max_abs);
      CHECK(s.max_rel == max_rel);
      CHECK_THAT(s.e_mean, WithinRel(mean_of(errors), 1e-12));
      CHECK_THAT(s.e_m2, WithinRel(m2_of(errors), 1e-10));
      CHECK_THAT(s.o_mean, WithinRel(mean_of(outputs), 1e-10));
      CHECK_THAT(s.o_m2, WithinRel(m2_of(outputs), 1e-10));
      CHECK_THAT(s.r_m2, WithinRel(m2_of(references), 1e-10));
      CHECK_THAT(s.sum_e2, WithinRel(sum_e2, 1e-12));
      CHECK_THAT(s.sum_abs_r, WithinRel(sum_abs_r, 1e-12));
      CHECK_THAT(s.sum_r2, WithinRel(sum_r2, 1e-12));
      CHECK_THAT(s.sum_o2, WithinRel(sum_o2, 1e-12));
      CHECK_THAT(s.sum_or, WithinRel(sum_or, 1e-12));
      CHECK(s.o_min == *std::min_element(outputs.begin(), outputs.end()));
      CHECK(s.o_max == *std::max_element(outputs.begin(), outputs.end()));
      CHECK(s.r_min == *std::min_element(references.begin(), references.end()));
      CHECK(s.r_max == *std::max_element(references.begin(), references.end()));
    }
  }
}

TEST_CASE("error sums: of equal largest errors the first stays, whichever share holds it and however they merge") {
  Elements e;
  for (int i = 0; i < 12; ++i) e.out.push_back(1.0), e.ref.push_back(i == 4 || i == 9 || i == 10 ? 0.5 : 1.0);
  for (const int threads : {1, 2, 3, 5}) {
    std::vector<int> reversed = in_order(threads);
    std::reverse(reversed.begin(), reversed.end());
    CHECK(fold_in_shares(e, threads, in_order(threads)).worst_index == 4);
    CHECK(fold_in_shares(e, threads, reversed).worst_index == 4);
  }
}

TEST_CASE("error sums: a spread far below its mean survives the fold (Welford's M2, not sums of squares)") {
  Elements e;
  for (int i = 0; i < 1000; ++i) e.out.push_back(1e8 + (i % 2 ? 1e-3 : -1e-3)), e.ref.push_back(0.0);
  const ErrorSums s = fold_in_shares(e, 7, in_order(7));
  CHECK_THAT(std::sqrt(s.e_m2 / static_cast<double>(s.finite)), WithinRel(1e-3, 1e-4));
  CHECK_THAT(std::sqrt(s.o_m2 / static_cast<double>(s.finite)), WithinRel(1e-3, 1e-4));
}

TEST_CASE("error sums: shares with nothing finite merge without moving extremes; a non-finite reference is counted and placed") {
  Elements e;
  e.out = {std::nan(""), 2.0, std::numeric_limits<double>::infinity(), -3.0};
  e.ref = {0.0, 1.0, 0.0, std::nan("")};
  const ErrorSums s = fold_in_shares(e, 4, {2, 0, 1, 3});
  CHECK(s.finite == 2);
  CHECK(s.nan == 1);
  CHECK(s.inf == 1);
  CHECK(s.reference_nonfinite == 1);
  CHECK(s.first_reference_nonfinite == 3);
  CHECK(s.o_min == -3.0);
  CHECK(s.o_max == 2.0);
  ErrorSums none;
  merge(none, fold_in_shares(Elements{{std::nan("")}, {1.0}}, 1, {0}));
  CHECK(none.finite == 0);
  CHECK(none.worst_index == -1);
}
