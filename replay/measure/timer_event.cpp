// The default GPU timer: CUDA events around each run on the default stream, a cold L2 unless
// --hot-l2 (a buffer twice the L2's size zeroed before each sample, as nvbench does), and samples
// taken while the SM clock ran under 75 % of its rated clock discarded, as nvbench's throttle
// guard does. Samples are pipelined: the next is queued while the GPU runs the last.
#include "replay/measure/cuda_clock.h"
#include "replay/measure/timer_rules.h"
#include "replay/measure/timers.h"

namespace attnreplay {
namespace {

class CudaEventTimer final : public SampleTimer {
 public:
  explicit CudaEventTimer(const CudaTimerOptions& options)
      : options_(options), clock_(options.cold_l2), guard_(clock_.rated_sm_mhz(), options.throttle_threshold) {}
  std::string method() const override { return std::string(timing_method_label(TimingMethod::event)); }
  std::string cache() const override { return options_.cold_l2 ? "cold-l2" : "hot-l2"; }

  void begin_kernel(PreparedKernel&) override { blocking_ = true; }
  // The sample queued ahead is dropped: the next turn may be another kernel's.
  void end_kernel() noexcept override {
    try {
      while (clock_.queued() > 0) clock_.collect();
    } catch (const std::exception&) {
      // A fault shows again at the next CUDA call, where it is reported.
    }
  }

  // One sample a call, with the next one queued behind it before it is waited for: the host
  // queues sample n+1 while the GPU runs sample n (cuda_clock::EventClock::queue).
  std::vector<std::optional<double>> time_samples(PreparedKernel& kernel) override {
    const auto run = [&kernel] { kernel.run(); };
    if (clock_.queued() == 0) clock_.queue(blocking_, run);
    clock_.queue(blocking_, run);
    const cuda_clock::Sample sample = clock_.collect();
    if (sample.block_timed_out) {
      // run() waits for the GPU: it cannot be queued ahead, so its samples are taken unblocked.
      blocking_ = false;
      return {std::nullopt};
    }
    if (!guard_.accept(sample.sm_mhz)) return {std::nullopt};
    return {sample.seconds};
  }

 private:
  CudaTimerOptions options_;
  cuda_clock::EventClock clock_;
  ThrottleGuard guard_;
  bool blocking_ = true;
};

}  // namespace

std::unique_ptr<SampleTimer> make_event_timer(const CudaTimerOptions& options) {
  return std::make_unique<CudaEventTimer>(options);
}

}  // namespace attnreplay
