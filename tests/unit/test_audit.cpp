// The audit's summaries (replay/run/audit.cpp) and printers (replay/report/audit_table.cpp) on calls built by
// hand: verdicts, the order of worst calls, distributions over calls, shape groups, and what the
// JSON, CSV and table carry.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "replay/run/audit.h"
#include "replay/report/printer.h"
#include "replay/report/records.h"

using namespace attnreplay;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::WithinAbs;

namespace {

// What a command does with a record: its JSON through the printer of a format.
template <class Record>
void audit_printer(const char* format, const Record& record, std::ostream& out) {
  const nlohmann::json json = audit_to_json(record);
  printer_for(format, json).print(json, out);
}

}  // namespace

namespace {

ErrorStats error_with(double rel_l2, double cosine = 0.999, std::int64_t nan_count = 0) {
  ErrorStats e;
  e.rel_l2 = rel_l2;
  e.cosine = cosine;
  e.max_abs = 10 * rel_l2;
  e.mean_abs = rel_l2 / 10;
  e.rmse = rel_l2 / 5;
  e.nan_count = nan_count;
  return e;
}

KernelResult kernel_result(const std::string& name, Disposition disposition, std::optional<ErrorStats> error) {
  KernelResult k;
  k.kernel = name;
  k.disposition = disposition;
  k.error = error;
  if (error) {
    TimingSummary t;
    t.samples = 3;
    t.median_s = 1e-3;
    k.timing = t;
  }
  return k;
}

CallResult call_with(std::int64_t index, AttentionShape shape, std::vector<KernelResult> kernels) {
  CallResult call;
  call.source = "cap.h5";
  call.call_index = index;
  call.op = "aten::scaled_dot_product_attention";
  call.shape = shape;
  call.dtype = "bfloat16";
  call.mask = "none";
  call.metadata = {{"layer", std::to_string(index % 3)}, {"step", std::to_string(index / 3)}};
  call.kernels = std::move(kernels);
  return call;
}

// Five calls of two shapes through kernels "fast" (errors 0.01 .. 0.05; calls 3 and 4 over bf16's
// default threshold of 0.03) and "picky" (declines call 0, throws on call 2).
AuditReport sample_audit() {
  const AttentionShape small{1, 2, 2, 16, 16, 8, 8}, large{1, 2, 2, 64, 64, 8, 8};
  const double fast_errors[5] = {0.02, 0.01, 0.025, 0.05, 0.04};
  AuditReport report;
  report.worst_count = 2;
  for (int i = 0; i < 5; ++i) {
    std::vector<KernelResult> kernels;
    const double e = fast_errors[i];
    kernels.push_back(kernel_result("fast", e > 0.03 ? Disposition::incorrect : Disposition::passed,
                                    error_with(e, i == 3 ? 0.99995 : 0.999)));
    if (i == 0) {
      kernels.push_back(kernel_result("picky", Disposition::not_supported, std::nullopt));
      kernels.back().reason = "needs bfloat16";
    } else if (i == 2) {
      kernels.push_back(kernel_result("picky", Disposition::failed, std::nullopt));
    } else {
      kernels.push_back(kernel_result("picky", Disposition::passed, error_with(0.001 * i)));
    }
    report.replay.calls.push_back(call_with(i, i < 3 ? small : large, std::move(kernels)));
  }
  std::map<std::pair<std::size_t, std::string>, std::vector<HeadError>> per_head;
  // Head 2's reference is not finite: its figures are NaN.
  per_head[{3, "fast"}] = {HeadError{0, 0, 0.01, 0.9999, 0.1, 0}, HeadError{0, 1, 0.07, 0.998, 0.4, 0},
                           HeadError{0, 2, NAN, NAN, NAN, 0}};
  summarize_audit(report, RefcheckThresholds{}, per_head);
  return report;
}

}  // namespace

TEST_CASE("audit verdict: passed only when every call that ran is within the thresholds") {
  using D = Disposition;
  const std::vector<D> good{D::passed, D::passed, D::not_supported};
  const KernelVerdict ok = verdict_of(good);
  CHECK(ok.verdict == Verdict::passed);
  CHECK(ok.calls_judged == 2);
  CHECK(ok.calls_not_supported == 1);
  const std::vector<D> one_bad{D::passed, D::incorrect, D::incorrect, D::passed};
  const KernelVerdict bad = verdict_of(one_bad);
  CHECK(bad.verdict == Verdict::failed);
  CHECK(bad.calls_failing == 2);
  CHECK(bad.calls_judged == 4);
  const std::vector<D> threw{D::passed, D::failed};
  CHECK(verdict_of(threw).verdict == Verdict::failed);
  CHECK(verdict_of(threw).calls_errored == 1);
  const std::vector<D> declined{D::not_supported};
  CHECK(verdict_of(declined).verdict == Verdict::not_run);
  CHECK(verdict_of({}).verdict == Verdict::not_run);
  CHECK(verdict_name(Verdict::not_run) == "not_run");
}

TEST_CASE("audit worst calls: non-finite outputs first, then by rel_l2, largest first") {
  const ErrorStats a = error_with(0.01), b = error_with(0.3), c = error_with(0.001, 0.9, 2), d = error_with(0.3);
  const std::vector<const ErrorStats*> errors{&a, &b, nullptr, &c, &d};
  CHECK(worst_first(errors) == std::vector<std::size_t>{3, 1, 4, 0});  // ties keep call order
}

TEST_CASE("audit statistics: the five summarised figures read from ErrorStats") {
  const ErrorStats e = error_with(0.5, 0.75);
  CHECK(audited_statistics() == std::vector<std::string>{"rel_l2", "cosine", "max_abs", "mean_abs", "rmse"});
  CHECK(statistic_of(e, "rel_l2") == 0.5);
  CHECK(statistic_of(e, "cosine") == 0.75);
  CHECK(statistic_of(e, "max_abs") == 5.0);
  CHECK_THROWS(statistic_of(e, "nosuch"));
}

TEST_CASE("audit stopping rule: a few samples, no minimum time") {
  const StoppingRule cpu = audit_stopping_rule(false);
  CHECK(cpu.min_time_s == 0);
  CHECK(cpu.min_samples == 3);
  CHECK(audit_stopping_rule(true).min_samples >= cpu.min_samples);
}

TEST_CASE("audit summary: distributions, verdicts, worst calls and shape groups of each kernel") {
  const AuditReport report = sample_audit();
  REQUIRE(report.kernels.size() == 2);
  const KernelAudit& fast = report.kernels[0];
  CHECK(fast.kernel == "fast");
  const Distribution& rel = fast.errors.at("rel_l2");
  CHECK(rel.count == 5);
  CHECK(rel.min == 0.01);
  CHECK(rel.median == 0.025);
  CHECK(rel.max == 0.05);
  CHECK_THAT(rel.p99, WithinAbs(0.04 + 0.96 * 0.01, 1e-12));
  CHECK(fast.verdict.verdict == Verdict::failed);
  CHECK(fast.verdict.calls_failing == 2);
  // Unregistered kernels are judged at the call's dtype: bf16's defaults.
  CHECK(fast.thresholds == std::vector<std::string>{"cosine >= 0.999, rel_l2 <= 0.03"});
  REQUIRE(fast.worst.size() == 2);  // --worst 2
  CHECK(fast.worst[0].call == 3);
  CHECK(fast.worst[1].call == 4);
  CHECK(fast.worst[0].per_head.size() == 3);
  CHECK(fast.worst[1].per_head.empty());
  CHECK(fast.median_time_s.median == 1e-3);

  const KernelAudit& picky = report.kernels[1];
  CHECK(picky.errors.at("rel_l2").count == 3);
  CHECK(picky.verdict.verdict == Verdict::failed);  // it threw on call 2
  CHECK(picky.verdict.calls_errored == 1);
  CHECK(picky.verdict.calls_not_supported == 1);
  CHECK(picky.not_supported_reasons == std::vector<std::string>{"needs bfloat16"});
  CHECK(report.any_verdict_failed());

  REQUIRE(report.shapes.size() == 2);
  CHECK(report.shapes[0].calls == std::vector<std::size_t>{0, 1, 2});
  CHECK(report.shapes[1].calls == std::vector<std::size_t>{3, 4});
  REQUIRE(report.shapes[1].kernels.size() == 2);
  CHECK_THAT(report.shapes[1].kernels[0].median_rel_l2, WithinAbs(0.045, 1e-12));
  CHECK(report.shapes[0].kernels[1].calls == 1);  // picky: declined call 0, threw on call 2
}

TEST_CASE("audit JSON: schema, per-kernel distributions and verdicts, worst calls with their heads") {
  const nlohmann::json j = audit_to_json(sample_audit());
  CHECK(j["schema"] == "attnreplay.audit");
  CHECK(j["schema_version"] == AuditReport::kJsonSchemaVersion);
  REQUIRE(j["calls"].size() == 5);
  CHECK(j["calls"][4]["layer"] == 1);  // metadata "1" as a number
  CHECK(j["calls"][4]["step"] == 1);
  CHECK(j["calls"][4]["position"] == 4);
  const nlohmann::json& fast = j["kernels"][0];
  CHECK(fast["verdict"] == "failed");
  CHECK(fast["calls_failing"] == 2);
  CHECK(fast["errors"]["cosine"]["count"] == 5);
  CHECK(fast["worst_calls"][0]["call_index"] == 3);
  CHECK(fast["worst_calls"][0]["per_head"][1]["rel_l2"] == 0.07);
  CHECK(fast["worst_calls"][0]["error"]["rel_l2"] == 0.05);
  CHECK_FALSE(fast["worst_calls"][0].contains("attribution"));  // not asked for
  CHECK(j["shapes"][0]["calls"] == nlohmann::json::array({0, 1, 2}));
  CHECK_FALSE(j["shapes"][0]["kernels"][0].contains("random"));
  // A kernel without values gives nulls, not NaN.
  AuditReport empty;
  KernelAudit none;
  none.kernel = "none";
  none.errors["rel_l2"] = distribution_of({});
  empty.kernels.push_back(none);
  CHECK(audit_to_json(empty)["kernels"][0]["errors"]["rel_l2"]["median"].is_null());
}

TEST_CASE("audit CSV: fixed columns, one row per call and kernel, layer and step from metadata") {
  std::ostringstream out;
  audit_printer("csv", sample_audit(), out);
  std::istringstream lines(out.str());
  std::string header, line;
  std::getline(lines, header);
  CHECK_THAT(header, ContainsSubstring("source,call_index,op,layer,step,"));
  CHECK_THAT(header, ContainsSubstring(",kernel,status,median_s,tflops,rel_l2,cosine,max_abs,mean_abs,rmse,"));
  int rows = 0;
  while (std::getline(lines, line)) ++rows;
  CHECK(rows == 10);
  CHECK(audit_csv_columns().back() == "rerun");
}

TEST_CASE("audit table: verdicts, distributions and the worst calls with their worst heads") {
  std::ostringstream out;
  audit_printer("table", sample_audit(), out);
  const std::string text = out.str();
  CHECK_THAT(text, ContainsSubstring("audit: 5 calls in 2 shapes, 2 kernels"));
  CHECK_THAT(text, ContainsSubstring("picky declined: needs bfloat16"));
  CHECK_THAT(text, ContainsSubstring("worst calls by rel_l2 (up to 2 per kernel)"));
  CHECK_THAT(text, ContainsSubstring("0,2 -; 0,1 0.07; 0,0 0.01"));  // heads, worst first, one with no figure first
  CHECK_THAT(text, ContainsSubstring("cosine >= 0.999, rel_l2 <= 0.03"));
  // Cosines near 1 print their distance from 1.
  CHECK_THAT(text, ContainsSubstring("1-5e-05"));  // call 3's 0.99995
  CHECK_THAT(text, ContainsSubstring("0.999000"));
  CHECK_THAT(text, !ContainsSubstring("captured against random inputs"));
}
