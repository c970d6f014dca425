#include "replay/run/timing_groups.h"

#include <catch2/catch_test_macros.hpp>

#include "call_fixtures.h"

namespace attnreplay {
namespace {

using test::CallSpec;
using test::MaskKind;
using test::random_call;

TEST_CASE("timing_key: values apart, everything a kernel's time depends on") {
  const AttentionCall a = random_call(CallSpec{.seed = 1});
  const std::string key = timing_key(a);
  // Other Q, K, V values, the same everything else: the same group.
  CHECK(timing_key(random_call(CallSpec{.seed = 2})) == key);

  AttentionCall other_dtype = random_call(CallSpec{.dtype = DType::bfloat16});
  CHECK(timing_key(other_dtype) != key);
  CHECK(timing_key(random_call(CallSpec{.layout = Layout::bshd})) != key);

  AttentionCall strides = a;
  strides.q.captured_strides = {};
  CHECK(timing_key(strides) != key);

  AttentionCall causal = a;
  causal.causal_alignment = CausalAlignment::top_left;
  CHECK(timing_key(causal) != key);
  causal.is_causal = false;
  CHECK(timing_key(causal) != key);

  AttentionCall longer = a;
  longer.k = HostTensor::allocate(a.k.dtype, {2, 2, 6, 8});
  CHECK(timing_key(longer) != key);

  // Masks: their contents too, since a block-sparse kernel skips what a mask hides.
  const AttentionCall masked1 = random_call(CallSpec{.mask = MaskKind::boolean, .seed = 1});
  const AttentionCall masked2 = random_call(CallSpec{.mask = MaskKind::boolean, .seed = 2});
  CHECK(timing_key(masked1) != key);
  AttentionCall same_mask = masked2;
  same_mask.mask = masked1.mask;
  CHECK(timing_key(same_mask) == timing_key(masked1));
  CHECK(timing_key(masked2) != timing_key(masked1));
}

TEST_CASE("TimingGroups: the first calls of a group are timed, the rest share the first's") {
  TimingSummary summary;
  summary.median_s = 1e-3;

  TimingGroups one(1);
  CHECK(one.shared("g", "flash") == nullptr);
  one.record("g", "flash", {.timing = summary, .timed_call = "run.h5: call 0"});
  const SharedTiming* shared = one.shared("g", "flash");
  REQUIRE(shared != nullptr);
  CHECK(shared->timed_call == "run.h5: call 0");
  CHECK(shared->timing->median_s == 1e-3);
  // Per kernel and per group.
  CHECK(one.shared("g", "sage2") == nullptr);
  CHECK(one.shared("h", "flash") == nullptr);

  TimingGroups two(2);
  two.record("g", "flash", {.timing = summary, .timed_call = "call 0"});
  CHECK(two.shared("g", "flash") == nullptr);
  two.record("g", "flash", {.timing = summary, .timed_call = "call 1"});
  REQUIRE(two.shared("g", "flash") != nullptr);
  CHECK(two.shared("g", "flash")->timed_call == "call 0");

  TimingGroups every(0);
  every.record("g", "flash", {.timing = summary, .timed_call = "call 0"});
  CHECK(every.shared("g", "flash") == nullptr);
}

}  // namespace
}  // namespace attnreplay
