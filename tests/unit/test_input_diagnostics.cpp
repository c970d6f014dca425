// Input diagnostics of the audit (replay/judge/input_diagnostics.cpp) on inputs built so that every
// ratio can be worked out by hand.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "replay/judge/input_diagnostics.h"

using namespace attnreplay;
using Catch::Matchers::WithinRel;

namespace {

// One batch, one head: Q is (32, 4), K and V are (4, 4), all float32 in bhsd.
AttentionCall diagnostic_call() {
  AttentionCall call;
  // K: channel c alternates mean_c + 1 and mean_c - 1 over the 4 keys (std 1 for every channel),
  // with means 8, 1, -1, 2: |means| sorted 1, 1, 2, 8, median 1.5.
  const double means[4] = {8, 1, -1, 2};
  std::vector<double> k;
  for (int j = 0; j < 4; ++j)
    for (int c = 0; c < 4; ++c) k.push_back(means[c] + (j % 2 ? -1.0 : 1.0));
  // Q: rows 0-15 have amax 1, rows 16-31 amax 4: two per_warp groups of 16 rows.
  std::vector<double> q;
  for (int i = 0; i < 32; ++i)
    for (int c = 0; c < 4; ++c) q.push_back(c == 0 ? (i < 16 ? 1.0 : 4.0) : 0.5);
  call.q = HostTensor::from_doubles(DType::float32, {1, 1, 32, 4}, q);
  call.k = HostTensor::from_doubles(DType::float32, {1, 1, 4, 4}, k);
  call.v = call.k;
  return call;
}

}  // namespace

TEST_CASE("input diagnostics: K channel-mean outliers against the other means and against the spread") {
  const InputDiagnostics d = diagnose_inputs(diagnostic_call(), QuantGranularity::per_warp);
  CHECK_THAT(d.k_mean_outlier_ratio, WithinRel(8.0 / 1.5, 1e-6));
  CHECK_THAT(d.k_mean_over_std, WithinRel(8.0, 1e-6));  // every channel's std is 1
  CHECK(d.k_outlier_channel == 0);
  CHECK(d.k_outlier_head == 0);
}

TEST_CASE("input diagnostics: INT8 group amax spread follows --quant_gran's groups") {
  const AttentionCall call = diagnostic_call();
  // per_warp: Q groups of 16 rows with amax 1 and 4, median 2.5; one K group of 4 keys.
  const InputDiagnostics warp = diagnose_inputs(call, QuantGranularity::per_warp);
  CHECK_THAT(warp.q_amax_spread, WithinRel(4.0 / 2.5, 1e-6));
  CHECK(warp.k_amax_spread == 1.0);
  // per_block: all 32 rows in one 64-row block, so one group and no spread.
  CHECK(diagnose_inputs(call, QuantGranularity::per_block).q_amax_spread == 1.0);
  // per_thread: K's groups are the keys with equal index mod 8, one key each here. Keys alternate
  // means + 1 = (9, 2, 0, 3) and means - 1 = (7, 0, -2, 1): amax 9, 7, 9, 7, median 8.
  const InputDiagnostics thread = diagnose_inputs(call, QuantGranularity::per_thread);
  CHECK_THAT(thread.k_amax_spread, WithinRel(9.0 / 8.0, 1e-6));
  // Smoothed, every key is +-1 in each channel: no spread left.
  CHECK(thread.k_smoothed_amax_spread == 1.0);
}

TEST_CASE("input diagnostics: max over median of zeros is 1, of a lone non-zero is infinite") {
  CHECK(max_over_median({0, 0, 0}) == 1.0);
  CHECK(max_over_median({}) == 1.0);
  CHECK(max_over_median({0, 0, 3}) == std::numeric_limits<double>::infinity());
  CHECK(max_over_median({1, 2, 6}) == 3.0);
}
