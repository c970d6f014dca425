// The default GPU timer: CUDA events around each run on the default stream, a cold L2 unless
// --hot-l2 (a buffer twice the L2's size zeroed before each sample, as nvbench does), and samples
// taken while the SM clock ran under 75 % of its rated clock discarded, as nvbench's throttle
// guard does.
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

  std::vector<std::optional<double>> time_samples(PreparedKernel& kernel) override {
    clock_.begin(blocking_);
    try {
      kernel.run();
    } catch (...) {
      clock_.release();
      throw;
    }
    const cuda_clock::Sample sample = clock_.end();
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
