// attnreplay compare's verdicts (replay/judge/run_comparison.h) on records written by hand.
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <nlohmann/json.hpp>

#include "formats/errors.h"
#include "replay/judge/run_comparison.h"

using namespace attnreplay;
using nlohmann::json;

namespace {

json kernel_row(const std::string& name, double median_ms, double half_width_rel, double spread, double rel_l2,
                const std::string& status = "not_verified") {
  const double m = median_ms * 1e-3;
  return {{"kernel", name},
          {"status", status},
          {"timing", {{"median_s", m}, {"median_ci_low_s", m * (1 - half_width_rel)},
                      {"median_ci_high_s", m * (1 + half_width_rel)}, {"spread_rel", spread}}},
          {"error", {{"rel_l2", rel_l2}}}};
}

json record(std::vector<json> calls) { return {{"calls", calls}, {"environment", {{"gpu", "H100"}}}}; }

json call(int index, std::vector<json> kernels, int seq = 128) {
  return {{"source", "/data/cap.h5"}, {"call_index", index}, {"case_tag", ""},
          {"shape", {{"seq_q", seq}}}, {"dtype", "bf16"}, {"kernels", kernels}};
}

const ComparedRow& row_of(const RunComparison& c, const std::string& kernel) {
  for (const auto& row : c.rows)
    if (row.kernel == kernel) return row;
  throw std::runtime_error("no row " + kernel);
}

}  // namespace

TEST_CASE("compare: faster or slower only where the intervals are apart and beyond both spreads") {
  const json base = record({call(0, {kernel_row("a", 1.0, 0.005, 0.01, 1e-3), kernel_row("b", 1.0, 0.005, 0.01, 1e-3),
                                     kernel_row("c", 1.0, 0.005, 0.10, 1e-3), kernel_row("d", 1.0, 0.005, 0.01, 1e-3)})});
  // a: 5 % slower, apart, beyond 1 % spread; b: 0.5 % slower, intervals overlap; c: 5 % slower
  // but within c's 10 % spread; d: 5 % faster.
  const json change = record({call(0, {kernel_row("a", 1.05, 0.005, 0.01, 1e-3), kernel_row("b", 1.005, 0.005, 0.01, 1e-3),
                                       kernel_row("c", 1.05, 0.005, 0.01, 1e-3), kernel_row("d", 0.95, 0.005, 0.01, 1e-3)})});
  const RunComparison c = compare_runs(base, "base.json", change, "new.json");
  CHECK(row_of(c, "a").speed == SpeedVerdict::slower);
  CHECK(row_of(c, "a").ratio == Catch::Approx(1.05));
  CHECK(row_of(c, "b").speed == SpeedVerdict::same);
  CHECK(row_of(c, "c").speed == SpeedVerdict::same);
  CHECK(row_of(c, "c").noise == Catch::Approx(0.10));
  CHECK(row_of(c, "d").speed == SpeedVerdict::faster);
  CHECK(regresses(row_of(c, "a"), 2));
  CHECK_FALSE(regresses(row_of(c, "a"), 10));
  CHECK_FALSE(regresses(row_of(c, "d"), 0));
  CHECK(c.differences.empty());
}

TEST_CASE("compare: a kernel less accurate, or failing where it ran, regresses even when faster") {
  const json base = record({call(0, {kernel_row("a", 1.0, 0.005, 0.01, 1e-3), kernel_row("b", 1.0, 0.005, 0.01, 1e-3),
                                     kernel_row("c", 1.0, 0.005, 0.01, 1e-3)})});
  json failing = kernel_row("c", 1.0, 0.005, 0.01, 1e-3, "failed");
  const json change = record({call(0, {kernel_row("a", 0.5, 0.005, 0.01, 2e-3), kernel_row("b", 1.0, 0.005, 0.01, 1.05e-3),
                                       failing})});
  const RunComparison c = compare_runs(base, "base.json", change, "new.json");
  CHECK(row_of(c, "a").speed == SpeedVerdict::faster);
  CHECK(row_of(c, "a").less_accurate);
  CHECK(regresses(row_of(c, "a"), 50));
  CHECK_FALSE(row_of(c, "b").less_accurate);  // 5 %: within what a varying summation order gives
  CHECK(row_of(c, "c").status_worse);
}

TEST_CASE("compare: the geometric mean counts a shared timing once; rows pair by file name, call, shape, kernel") {
  json shared = kernel_row("a", 2.0, 0.005, 0.01, 1e-3);
  shared["timing_shared_from"] = "cap.h5 call 0";
  json shared_change = kernel_row("a", 1.0, 0.005, 0.01, 1e-3);
  shared_change["timing_shared_from"] = "cap.h5 call 0";
  const json base = record({call(0, {kernel_row("a", 2.0, 0.005, 0.01, 1e-3)}), call(1, {shared}),
                            call(2, {kernel_row("a", 1.0, 0.005, 0.01, 1e-3)})});
  json moved = record({call(0, {kernel_row("a", 1.0, 0.005, 0.01, 1e-3)}), call(1, {shared_change}),
                       call(2, {kernel_row("a", 4.0, 0.005, 0.01, 1e-3)}, 256)});
  moved["calls"][0]["source"] = "/elsewhere/cap.h5";  // the same capture read from another folder
  moved["environment"]["gpu"] = "H200";
  const RunComparison c = compare_runs(base, "base.json", moved, "new.json");
  REQUIRE(c.kernels.size() == 1);
  CHECK(c.kernels[0].calls == 2);                       // call 2's shape differs: not the same call
  CHECK(c.kernels[0].timed == 1);                       // call 1 shares call 0's timing
  CHECK(c.kernels[0].geomean_ratio == Catch::Approx(0.5));
  CHECK(c.only_in_base == 1);
  CHECK(c.only_in_change == 1);
  REQUIRE(c.differences.size() == 1);
  CHECK(c.differences[0] == "GPU: H100 vs H200");
}

TEST_CASE("compare: a record that is not a run's is named") {
  CHECK_THROWS_AS(compare_runs(json{{"kernels", json::array()}}, "audit.json", record({}), "new.json"), InputError);
}

TEST_CASE("compare: a kernel whose headline covers other work in the two runs is named") {
  json old_row = kernel_row("sageattn-triton", 0.1, 0.005, 0.01, 1e-2);
  old_row["timing_with_preparation"] = {{"median_s", 0.18e-3}};  // written before `timed`: the kernel alone
  json new_row = kernel_row("sageattn-triton", 0.18, 0.005, 0.01, 1e-2);
  new_row["timed"] = "call";
  const RunComparison c = compare_runs(record({call(0, {old_row})}), "base.json", record({call(0, {new_row})}), "new.json");
  REQUIRE(c.differences.size() == 1);
  CHECK(c.differences[0].find("sageattn-triton: the base timed the kernel alone, the change the whole call") == 0);
  // The same coverage in both: nothing to say.
  const RunComparison same = compare_runs(record({call(0, {new_row})}), "a.json", record({call(0, {new_row})}), "b.json");
  CHECK(same.differences.empty());
}
