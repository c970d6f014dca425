// Quantiles and distributions over calls (replay/judge/distribution.cpp), against numpy's default
// (linear) percentile worked by hand.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "replay/judge/distribution.h"

using namespace attnreplay;
using Catch::Matchers::WithinAbs;

TEST_CASE("percentile: linear between the closest ranks, as numpy.percentile") {
  const std::vector<double> sorted{1, 2, 4, 8};
  CHECK(percentile(sorted, 0.0) == 1);
  CHECK(percentile(sorted, 1.0) == 8);
  CHECK(percentile(sorted, 0.5) == 3);  // the mean of the middle two
  // rank 0.99 * 3 = 2.97: 4 + 0.97 * (8 - 4)
  CHECK_THAT(percentile(sorted, 0.99), WithinAbs(7.88, 1e-12));
  CHECK_THAT(percentile(sorted, 0.25), WithinAbs(1.75, 1e-12));  // rank 0.75
  CHECK(percentile(std::vector<double>{5}, 0.99) == 5);
  CHECK(std::isnan(percentile(std::vector<double>{}, 0.5)));
  // Out-of-range fractions clamp; equal infinite neighbours give infinity, not NaN.
  CHECK(percentile(sorted, 2.0) == 8);
  const double inf = std::numeric_limits<double>::infinity();
  CHECK(percentile(std::vector<double>{1, inf, inf}, 0.9) == inf);
}

TEST_CASE("distribution: min <= median <= p99 <= max over unsorted values, NaN left out") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Distribution d = distribution_of({0.3, nan, 0.1, 0.9, 0.2, 0.5});
  CHECK(d.count == 5);
  CHECK(d.min == 0.1);
  CHECK(d.median == 0.3);
  CHECK(d.max == 0.9);
  // rank 0.99 * 4 = 3.96 between 0.5 and 0.9
  CHECK_THAT(d.p99, WithinAbs(0.5 + 0.96 * 0.4, 1e-12));
  CHECK((d.min <= d.median && d.median <= d.p99 && d.p99 <= d.max));

  const Distribution none = distribution_of({});
  CHECK(none.count == 0);
  CHECK(std::isnan(none.median));
  const Distribution only_nan = distribution_of({nan, nan});
  CHECK(only_nan.count == 0);
}
