// The step order of the GPU input preparation (kernels/cuda/preparation_plan.h), checked on the
// CPU: every block listed once, every wait on steps listed before it and counted right, gathers
// and their uses spaced as asked. A plan that broke the first two would hang or corrupt the GPU
// kernel, which the GPU tests could only see as a time-out.
#include <catch2/catch_test_macros.hpp>

#include <map>
#include <set>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "kernels/cuda/preparation_plan.h"

using namespace attnreplay::cuda_attention;

namespace {

TensorWork work(std::uint8_t tensor, std::int64_t heads, std::int64_t head_bytes, std::int64_t main_steps,
                std::int64_t gather_steps = 0, bool serial = false, bool whole_tensor = false) {
  TensorWork t;
  t.tensor = tensor;
  t.heads = heads;
  t.head_bytes = head_bytes;
  t.main = StepKind::fp8_rows_block;
  t.main_steps = main_steps;
  t.gather = serial ? StepKind::channel_mean : StepKind::abs_max_block;
  t.gather_steps = gather_steps;
  t.gather_serial = serial;
  t.gather_whole_tensor = whole_tensor;
  return t;
}

// Checks what every plan must satisfy and returns each step's position by (kind, tensor, head, block).
std::map<std::tuple<int, int, int, int>, std::size_t> check_plan(const std::vector<TensorWork>& tensors,
                                                                const PreparationPlan& plan) {
  std::map<std::tuple<int, int, int, int>, std::size_t> position;
  std::map<std::uint32_t, std::uint32_t> signalled;  // counter -> steps listed so far that add to it
  for (std::size_t i = 0; i < plan.steps.size(); ++i) {
    const Step& s = plan.steps[i];
    const auto key = std::make_tuple(static_cast<int>(s.kind), static_cast<int>(s.tensor), static_cast<int>(s.head),
                                     static_cast<int>(s.block));
    REQUIRE(position.emplace(key, i).second);  // listed once
    REQUIRE(s.wait < plan.counters);
    REQUIRE(s.signal < plan.counters);
    // A wait is on steps listed before it, all of them: its count is reached and never passed.
    if (s.wait != 0) REQUIRE(signalled[s.wait] == s.wait_count);
    if (s.signal != 0) ++signalled[s.signal];
  }
  std::size_t expected = 0;
  for (const TensorWork& t : tensors) expected += static_cast<std::size_t>(t.heads * (t.main_steps + t.gather_steps));
  REQUIRE(plan.steps.size() == expected);
  return position;
}

}  // namespace

TEST_CASE("preparation plan: single-phase inputs list each block once, heads interleaved") {
  const std::vector<TensorWork> tensors = {work(0, 4, 1000, 3), work(1, 2, 1000, 2)};
  const PreparationPlan plan = plan_preparation(tensors, 0);
  check_plan(tensors, plan);
  CHECK(plan.counters == 1);
  // GQA-like: the input with half the heads is spread over the other's, not put after it.
  std::vector<int> tensor_order;
  for (const Step& s : plan.steps) {
    if (tensor_order.empty() || tensor_order.back() != s.tensor) tensor_order.push_back(s.tensor);
  }
  CHECK(tensor_order == std::vector<int>{0, 1, 0, 1, 0});
}

TEST_CASE("preparation plan: a head's uses wait for its gathers and come reuse_bytes later") {
  const std::int64_t head_bytes = 100;
  const std::vector<TensorWork> tensors = {work(0, 8, head_bytes, 2, 3)};
  for (const std::int64_t reuse : {0, 100, 250, 10'000}) {
    const PreparationPlan plan = plan_preparation(tensors, reuse);
    const auto position = check_plan(tensors, plan);
    CHECK(plan.counters == 1 + 8);
    for (int head = 0; head < 8; ++head) {
      const std::size_t last_gather = position.at({static_cast<int>(StepKind::abs_max_block), 0, head, 2});
      const std::size_t first_use = position.at({static_cast<int>(StepKind::fp8_rows_block), 0, head, 0});
      CHECK(first_use > last_gather);
      // Input listed between them: each later head's gathers count its bytes.
      std::int64_t between = 0;
      for (std::size_t i = last_gather + 1; i < first_use; ++i) {
        if (plan.steps[i].kind == StepKind::abs_max_block && plan.steps[i].block == 0) between += head_bytes;
      }
      const bool at_the_end = head + reuse / head_bytes >= 8;
      if (!at_the_end) CHECK(between + head_bytes >= reuse);
      if (reuse == 0) CHECK(first_use == last_gather + 1);
    }
  }
}

TEST_CASE("preparation plan: serial gathers first, their uses last") {
  const std::vector<TensorWork> tensors = {work(0, 2, 100, 4), work(1, 2, 100, 2, 4, /*serial=*/true)};
  const PreparationPlan plan = plan_preparation(tensors, 100);
  check_plan(tensors, plan);
  for (std::size_t i = 0; i < 8; ++i) CHECK(plan.steps[i].kind == StepKind::channel_mean);
  for (std::size_t i = plan.steps.size() - 4; i < plan.steps.size(); ++i) {
    CHECK(plan.steps[i].tensor == 1);
    CHECK(plan.steps[i].wait_count == 4);
  }
}

TEST_CASE("preparation plan: a whole-tensor figure waits for every head's gathers") {
  const std::vector<TensorWork> tensors = {work(0, 3, 100, 2, 2, false, /*whole_tensor=*/true),
                                           work(1, 3, 100, 2, 2)};
  const PreparationPlan plan = plan_preparation(tensors, 0);
  check_plan(tensors, plan);
  CHECK(plan.counters == 1 + 1 + 3);
  for (const Step& s : plan.steps) {
    if (s.tensor == 0 && s.kind == StepKind::fp8_rows_block) CHECK(s.wait_count == 6);
    if (s.tensor == 1 && s.kind == StepKind::fp8_rows_block) CHECK(s.wait_count == 2);
  }
}

TEST_CASE("preparation plan: inputs with no work are refused") {
  CHECK_THROWS_AS(plan_preparation({work(0, 0, 100, 1)}, 0), std::invalid_argument);
  CHECK_THROWS_AS(plan_preparation({work(0, 1, 100, 0)}, 0), std::invalid_argument);
}
