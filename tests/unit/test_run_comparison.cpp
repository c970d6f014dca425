// attnreplay compare's verdicts (replay/judge/run_comparison.h) on records written by hand.
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <nlohmann/json.hpp>

#include "formats/errors.h"
#include "replay/judge/run_comparison.h"
#include "replay/report/comparison_report.h"

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

TEST_CASE("compare: faster or slower only where the intervals are apart, beyond both spreads and the minimum difference") {
  const json base = record({call(0, {kernel_row("a", 1.0, 0.005, 0.01, 1e-3), kernel_row("b", 1.0, 0.005, 0.01, 1e-3),
                                     kernel_row("c", 1.0, 0.005, 0.10, 1e-3), kernel_row("d", 1.0, 0.005, 0.01, 1e-3),
                                     kernel_row("e", 1.0, 0.002, 0.005, 1e-3), kernel_row("f", 1.0, 0.005, 0.03, 1e-3),
                                     kernel_row("g", 1.0, 0.005, 0.10, 1e-3)})});
  // a: 5 % slower, apart, beyond 3x its 1 % spread and 3 %; b: 0.5 % slower, intervals overlap; c:
  // 5 % slower, but c's spread is 10 %; d: 5 % faster; e: 2 % slower, apart, but under 3 %; f: 8 %
  // slower with a spread of exactly 3 %; g: 40 % slower, but with a spread of 10 %.
  const json change = record({call(0, {kernel_row("a", 1.05, 0.005, 0.01, 1e-3), kernel_row("b", 1.005, 0.005, 0.01, 1e-3),
                                       kernel_row("c", 1.05, 0.005, 0.01, 1e-3), kernel_row("d", 0.95, 0.005, 0.01, 1e-3),
                                       kernel_row("e", 1.02, 0.002, 0.005, 1e-3), kernel_row("f", 1.08, 0.005, 0.01, 1e-3),
                                       kernel_row("g", 1.4, 0.005, 0.01, 1e-3)})});
  const RunComparison c = compare_runs(base, "base.json", change, "new.json");
  CHECK(row_of(c, "a").speed == SpeedVerdict::slower);
  CHECK(row_of(c, "a").ratio == Catch::Approx(1.05));
  CHECK(row_of(c, "b").speed == SpeedVerdict::same);
  CHECK(row_of(c, "c").speed == SpeedVerdict::noisy);
  CHECK(row_of(c, "c").noise == Catch::Approx(0.10));
  CHECK(row_of(c, "d").speed == SpeedVerdict::faster);
  CHECK(row_of(c, "e").speed == SpeedVerdict::same);
  CHECK(row_of(c, "f").speed == SpeedVerdict::noisy);
  CHECK(row_of(c, "g").speed == SpeedVerdict::noisy);
  CHECK(row_of(c, "g").ratio == Catch::Approx(1.4));
  CHECK_FALSE(regresses(row_of(c, "c"), 0));  // too noisy to judge is never a regression
  CHECK_FALSE(regresses(row_of(c, "f"), 5));
  CHECK_FALSE(regresses(row_of(c, "g"), 25));
  // A smaller minimum difference judges e; a larger one leaves a's 5 % the same.
  CHECK(row_of(compare_runs(base, "base.json", change, "new.json", 0.01), "e").speed == SpeedVerdict::slower);
  CHECK(row_of(compare_runs(base, "base.json", change, "new.json", 0.06), "a").speed == SpeedVerdict::same);
  CHECK(c.kernels.size() == 7);
  CHECK(regresses(row_of(c, "a"), 2));
  CHECK_FALSE(regresses(row_of(c, "a"), 10));
  CHECK_FALSE(regresses(row_of(c, "d"), 0));
  CHECK(c.differences.empty());
}

TEST_CASE("compare: the noise shown sits on the verdict's side of the minimum difference") {
  // 2.96 % of noise is under the 3 % minimum, so the 10 % change is judged; shown rounded to "3.0"
  // it would read as too noisy.
  const json base = record({call(0, {kernel_row("a", 1.0, 0.005, 0.0296, 1e-3)})});
  const json change = record({call(0, {kernel_row("a", 0.9, 0.005, 0.01, 1e-3)})});
  const RunComparison c = compare_runs(base, "base.json", change, "new.json");
  REQUIRE(row_of(c, "a").speed == SpeedVerdict::faster);
  const std::string text = comparison_text(c, ComparisonView{.every_row = true});
  CHECK(text.find(" 2.9 ") != std::string::npos);
  CHECK(text.find(" 3.0 ") == std::string::npos);
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

TEST_CASE("compare: calls that share a timing are one row with their count; rows pair by file name, call, shape, kernel") {
  json shared = kernel_row("a", 2.0, 0.005, 0.01, 1e-3);
  shared["timing_shared_from"] = "/data/cap.h5: call 0";  // as AttentionCall::where() names it
  json shared_change = kernel_row("a", 1.0, 0.005, 0.01, 1.5e-3);
  shared_change["timing_shared_from"] = "/elsewhere/cap.h5: call 0";
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
  // Calls 0 and 1 are one row (call 1 less accurate), then each of call 2's shapes alone.
  REQUIRE(c.rows.size() == 3);
  CHECK(c.rows[0].call == "cap.h5 call 0");
  CHECK(c.rows[0].calls == 2);
  CHECK(c.rows[0].speed == SpeedVerdict::faster);
  CHECK(c.rows[0].less_accurate);
  CHECK(*c.rows[0].change_rel_l2 == Catch::Approx(1.5e-3));
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

TEST_CASE("compare: repeated runs of each side: their medians' median, and the spread between them as noise") {
  // Two base runs 1.00 and 1.10 ms apart (10 %): a change at 1.06 ms is too noisy to judge, however
  // tight each run's own samples are; two base runs that agree make the same change slower.
  const auto one = [](double ms) { return record({call(0, {kernel_row("a", ms, 0.002, 0.005, 1e-3)})}); };
  const ComparedRuns change{"new", {one(1.06), one(1.061)}};
  const RunComparison apart = compare_runs(ComparedRuns{"base", {one(1.0), one(1.10)}}, change);
  REQUIRE(apart.rows.size() == 1);
  CHECK(apart.rows[0].base->runs == 2);
  CHECK(apart.rows[0].base->median_s == Catch::Approx(1.05e-3));
  CHECK(apart.rows[0].noise == Catch::Approx(0.1 / 1.05));
  CHECK(apart.rows[0].speed == SpeedVerdict::noisy);
  const RunComparison agreeing = compare_runs(ComparedRuns{"base", {one(1.0), one(1.001)}}, change);
  CHECK(agreeing.rows[0].speed == SpeedVerdict::slower);
  CHECK(agreeing.rows[0].ratio == Catch::Approx(1.0605 / 1.0005));
}
