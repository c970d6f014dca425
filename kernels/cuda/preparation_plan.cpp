// Step order of the input preparation (kernels/cuda/preparation_plan.h).
#include "kernels/cuda/preparation_plan.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <stdexcept>
#include <string>

namespace attnreplay::cuda_attention {
namespace {

struct Job {
  const TensorWork* work = nullptr;
  std::int64_t head = 0;
  double position = 0;  // where in its tensor, 0..1: interleaves inputs of different head counts
};

class Planner {
 public:
  explicit Planner(const std::vector<TensorWork>& tensors) : tensors_(tensors) {
    for (const TensorWork& t : tensors) {
      if (t.heads <= 0 || t.main_steps <= 0 || t.gather_steps < 0 || t.head_bytes < 0) {
        throw std::invalid_argument("preparation plan: input " + std::to_string(t.tensor) + " has no work");
      }
      if (t.gather_steps == 0) continue;
      tensor_counter_.push_back(plan_.counters);
      plan_.counters += static_cast<std::uint32_t>(t.gather_whole_tensor ? 1 : t.heads);
    }
  }

  void gather(const TensorWork& t, std::int64_t head) {
    for (std::int64_t b = 0; b < t.gather_steps; ++b) emit(t.gather, t, head, b, 0, 0, counter(t, head));
  }
  void main(const TensorWork& t, std::int64_t head) {
    const std::uint32_t wait = t.gather_steps > 0 ? counter(t, head) : 0;
    const std::int64_t count = t.gather_whole_tensor ? t.gather_steps * t.heads : t.gather_steps;
    for (std::int64_t b = 0; b < t.main_steps; ++b) emit(t.main, t, head, b, wait, count, 0);
  }

  PreparationPlan take() {
    if (plan_.steps.size() > std::numeric_limits<std::uint32_t>::max()) {
      throw std::invalid_argument("preparation plan: more than 2^32 steps");
    }
    return std::move(plan_);
  }

 private:
  std::uint32_t counter(const TensorWork& t, std::int64_t head) const {
    std::size_t index = 0;
    for (const TensorWork& other : tensors_) {
      if (&other == &t) break;
      if (other.gather_steps > 0) ++index;
    }
    return tensor_counter_[index] + static_cast<std::uint32_t>(t.gather_whole_tensor ? 0 : head);
  }
  void emit(StepKind kind, const TensorWork& t, std::int64_t head, std::int64_t block, std::uint32_t wait,
            std::int64_t wait_count, std::uint32_t signal) {
    Step s;
    s.kind = kind;
    s.tensor = t.tensor;
    s.head = static_cast<std::uint32_t>(head);
    s.block = static_cast<std::uint32_t>(block);
    s.wait = wait;
    s.wait_count = static_cast<std::uint32_t>(wait_count);
    s.signal = signal;
    plan_.steps.push_back(s);
  }

  const std::vector<TensorWork>& tensors_;
  std::vector<std::uint32_t> tensor_counter_;  // first counter of each tensor that gathers
  PreparationPlan plan_;
};

}  // namespace

PreparationPlan plan_preparation(const std::vector<TensorWork>& tensors, std::int64_t reuse_bytes) {
  Planner planner(tensors);

  // Serial gathers (channel means) take long and read little at a time: first, so that they
  // overlap the rest, and their uses last, so that nothing waits on them.
  for (const TensorWork& t : tensors) {
    if (!t.gather_serial || t.gather_steps == 0) continue;
    for (std::int64_t h = 0; h < t.heads; ++h) planner.gather(t, h);
  }

  // The other inputs head by head, interleaved by position in their tensor.
  std::vector<Job> jobs;
  for (const TensorWork& t : tensors) {
    if (t.gather_serial && t.gather_steps > 0) continue;
    for (std::int64_t h = 0; h < t.heads; ++h) {
      jobs.push_back({&t, h, (static_cast<double>(h) + 0.5) / static_cast<double>(t.heads)});
    }
  }
  std::stable_sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.position < b.position; });

  struct Pending {
    Job job;
    std::int64_t mark = 0;  // input bytes listed when its gathers were
  };
  std::deque<Pending> pending;
  std::int64_t listed = 0;
  std::vector<std::int64_t> gathered_heads(tensors.size(), 0);
  auto tensor_index = [&](const TensorWork* t) { return static_cast<std::size_t>(t - tensors.data()); };
  auto ready = [&](const Pending& p) {
    const TensorWork& t = *p.job.work;
    if (t.gather_whole_tensor && gathered_heads[tensor_index(&t)] < t.heads) return false;
    return listed - p.mark >= reuse_bytes;
  };
  for (const Job& job : jobs) {
    const TensorWork& t = *job.work;
    if (t.gather_steps > 0) {
      planner.gather(t, job.head);
      ++gathered_heads[tensor_index(&t)];
      pending.push_back({job, listed});
    } else {
      planner.main(t, job.head);
    }
    listed += t.head_bytes;
    while (!pending.empty() && ready(pending.front())) {
      planner.main(*pending.front().job.work, pending.front().job.head);
      pending.pop_front();
    }
  }
  for (const Pending& p : pending) planner.main(*p.job.work, p.job.head);

  for (const TensorWork& t : tensors) {
    if (!t.gather_serial || t.gather_steps == 0) continue;
    for (std::int64_t h = 0; h < t.heads; ++h) planner.main(t, h);
  }
  return planner.take();
}

}  // namespace attnreplay::cuda_attention
