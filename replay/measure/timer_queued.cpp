// --timing queued: triton's do_bench method (replay/cuda_clock.h, EventClock::time_queued). Its
// figure for a short call includes the host's launch latency wherever the GPU runs ahead of the
// host, which --timing event's blocking kernel keeps out (docs/metrics.md): offered so that a
// figure can be set beside a do_bench one, method for method.
#include "replay/measure/cuda_clock.h"
#include "replay/measure/timer_rules.h"
#include "replay/measure/timers.h"

namespace attnreplay {
namespace {

// do_bench zeroes 256 MB (its empty cache for benchmarks) before each run.
constexpr std::size_t kDoBenchFlushBytes = std::size_t{256} << 20;

class CudaQueuedTimer final : public SampleTimer {
 public:
  explicit CudaQueuedTimer(const CudaTimerOptions& options)
      : options_(options),
        clock_(options.cold_l2, kDoBenchFlushBytes),
        guard_(clock_.rated_sm_mhz(), options.throttle_threshold) {}
  std::string method() const override { return std::string(timing_method_label(TimingMethod::queued)); }
  std::string cache() const override { return options_.cold_l2 ? "cold-l2" : "hot-l2"; }

  // As do_bench estimates a run from five, flush included, and queues runs for 100 ms: the five
  // are not kept.
  void begin_kernel(PreparedKernel& kernel) override {
    constexpr int kEstimateRuns = 5;
    const auto estimate = clock_.time_queued(kEstimateRuns, [&kernel] { kernel.run(); });
    double total = 0;
    for (double seconds : estimate.seconds) total += seconds;
    // The flush's GPU time counts too: the batch fills about 0.1 s of it, as do_bench's loop does.
    runs_per_batch_ = runs_filling(total / kEstimateRuns + flush_estimate_s(), /*target_s=*/0.1, /*max_runs=*/1000);
  }

  std::vector<std::optional<double>> time_samples(PreparedKernel& kernel) override {
    const auto batch = clock_.time_queued(runs_per_batch_, [&kernel] { kernel.run(); });
    // One clock reading for the batch: a throttled batch is discarded whole.
    const bool accepted = guard_.accept(batch.sm_mhz);
    std::vector<std::optional<double>> samples;
    for (double seconds : batch.seconds) samples.push_back(accepted ? std::optional<double>(seconds) : std::nullopt);
    return samples;
  }

 private:
  // 256 MB written at about 3 TB/s; a rough figure is enough to size a batch.
  double flush_estimate_s() const { return options_.cold_l2 ? kDoBenchFlushBytes / 3e12 : 0.0; }

  CudaTimerOptions options_;
  cuda_clock::EventClock clock_;
  ThrottleGuard guard_;
  int runs_per_batch_ = 1;
};

}  // namespace

std::unique_ptr<SampleTimer> make_queued_timer(const CudaTimerOptions& options) {
  return std::make_unique<CudaQueuedTimer>(options);
}

}  // namespace attnreplay
