// The per-kernel summary over a record (replay/judge/kernel_summary.h) that the run's closing
// table and the HTML report show, on records written by hand.
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <nlohmann/json.hpp>

#include "replay/judge/kernel_summary.h"
#include "replay/report/html_report.h"

using namespace attnreplay;
using nlohmann::json;

namespace {

json timed(const std::string& name, double ms, double rel_l2, double with_preparation_ms = 0) {
  json k = {{"kernel", name}, {"status", "not_verified"}, {"timing", {{"median_s", ms * 1e-3}}},
            {"error", {{"rel_l2", rel_l2}}}};
  if (with_preparation_ms > 0) {
    k["timed"] = "kernel";  // the headline is the kernel alone, the whole call beside it
    k["timing_with_preparation"] = {{"median_s", with_preparation_ms * 1e-3}};
  }
  return k;
}

json refused(const std::string& name, const std::string& reason) {
  return {{"kernel", name}, {"status", "not_supported"}, {"reason", reason}};
}

json call(int index, std::vector<json> kernels) {
  return {{"source", "/data/cap.h5"}, {"call_index", index}, {"case_tag", ""}, {"kernels", kernels},
          {"shape", {{"batch", 1}, {"heads_q", 2}, {"heads_kv", 2}, {"seq_q", 8}, {"seq_kv", 8}, {"head_dim_qk", 4},
                     {"head_dim_vo", 4}}},
          {"metadata", {{"layer", std::to_string(index)}, {"step", "0"}}}};
}

const KernelStanding& standing(const KernelSummary& s, const std::string& name) {
  for (const auto& k : s.kernels)
    if (k.name == name) return k;
  throw std::runtime_error("no kernel " + name);
}

}  // namespace

TEST_CASE("kernel summary: ratios of whole calls to the fastest exact kernel, errors, refusals once") {
  json quantized = timed("q8", 0.5, 3e-2, 1.5);  // fastest kernel alone, slowest with its preparation
  quantized["reduced_precision"] = "int8";
  json q8_other = timed("q8", 0.5, 4e-2, 1.5);
  q8_other["reduced_precision"] = "int8";
  const json record = {{"schema", "attnreplay.results"},
                       {"calls", {call(0, {timed("a", 1.0, 1e-6), timed("b", 2.0, 2e-6), quantized, refused("gpu", "no CUDA device")}),
                                  call(1, {timed("a", 1.0, 3e-6), timed("b", 4.0, 1e-6), q8_other, refused("gpu", "no CUDA device")})}}};
  const KernelSummary s = summarize_kernels(record, "");
  CHECK(s.calls == 2);
  CHECK(s.baseline == "a");  // q8 is faster alone but quantized: not a default baseline
  CHECK(standing(s, "a").vs_baseline == Catch::Approx(1.0));
  CHECK(standing(s, "b").vs_baseline == Catch::Approx(std::sqrt(2.0 * 4.0)));  // geometric mean
  CHECK(standing(s, "q8").vs_baseline == Catch::Approx(1.5));                   // the whole call, not 0.5
  CHECK(standing(s, "b").median_rel_l2 == Catch::Approx(2e-6));
  CHECK(standing(s, "a").worst_rel_l2 == Catch::Approx(3e-6));
  CHECK(standing(s, "a").worst_call == "call 1");
  CHECK(standing(s, "gpu").refused == 2);
  CHECK(standing(s, "gpu").ran == 0);
  REQUIRE(s.refusals.size() == 1);
  CHECK(s.refusals[0].reason == "no CUDA device");
  // Fastest first, the kernel that only refused last.
  CHECK(s.kernels.front().name == "a");
  CHECK(s.kernels.back().name == "gpu");

  const KernelSummary named = summarize_kernels(record, "b");
  CHECK(named.baseline == "b");
  CHECK(standing(named, "a").vs_baseline == Catch::Approx(1.0 / std::sqrt(8.0)));
  const KernelSummary missing = summarize_kernels(record, "gpu");
  CHECK(missing.baseline == "a");
  CHECK(missing.baseline_note.find("--baseline gpu has no time") != std::string::npos);
}

TEST_CASE("HTML report: the page's data per row, and records of other kinds refused by name") {
  const json record = {{"schema", "attnreplay.results"},
                       {"environment", {{"gpu", "NVIDIA H100"}, {"ceiling_bf16_tflops", "782"}, {"ceiling_copy_gbps", "3000"}}},
                       {"calls", {call(0, {timed("a", 1.0, 1e-6, 1.25)})}}};
  const json page = report_page_data({"r.json", &record}, "");
  REQUIRE(page["rows"].size() == 1);
  const json& row = page["rows"][0];
  CHECK(row["kernel_s"].get<double>() == Catch::Approx(1e-3));
  CHECK(row["call_s"].get<double>() == Catch::Approx(1.25e-3));
  CHECK(row["layer"] == 0);
  CHECK(row["step"] == 0);
  CHECK(page["ceilings"]["bf16_tflops"].get<double>() == Catch::Approx(782));
  CHECK(page["summary"]["baseline"] == "a");

  const json other = {{"schema", "attnreplay.capture"}, {"calls", json::array()}};
  CHECK_THROWS_WITH(report_page_data({"other.json", &other}, ""),
                    Catch::Matchers::ContainsSubstring("other.json: not a run's or an audit's record"));
  // A '<' in any text cannot end the page's data script early.
  json sneaky = record;
  sneaky["calls"][0]["kernels"][0]["kernel"] = "</script><script>alert(1)</script>";
  const std::string html = html_report({{"r.json", &sneaky}}, "");
  CHECK(html.find("</script><script>alert") == std::string::npos);
}
