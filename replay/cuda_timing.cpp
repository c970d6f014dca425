#include "replay/cuda_timing.h"

#include "replay/cuda_clock.h"

namespace attnreplay {
namespace {

class CudaEventTimer final : public SampleTimer {
 public:
  explicit CudaEventTimer(const CudaTimerOptions& options) : options_(options), clock_(options.cold_l2) {}
  std::string method() const override { return "cuda-event"; }
  std::string cache() const override { return options_.cold_l2 ? "cold-l2" : "hot-l2"; }

  std::optional<double> time_one(PreparedKernel& kernel) override {
    clock_.begin();
    kernel.run();
    const cuda_clock::Sample sample = clock_.end();
    max_seen_mhz_ = std::max(max_seen_mhz_, sample.sm_mhz);
    // Without a rated clock, the highest clock seen so far stands in for it.
    const double rated = clock_.rated_sm_mhz() > 0 ? clock_.rated_sm_mhz() : max_seen_mhz_;
    if (sample.sm_mhz > 0 && sample.sm_mhz < options_.throttle_threshold * rated) return std::nullopt;
    return sample.seconds;
  }

 private:
  CudaTimerOptions options_;
  cuda_clock::EventClock clock_;
  double max_seen_mhz_ = 0;
};

}  // namespace

bool cuda_device_present() { return cuda_clock::device_present(); }

std::unique_ptr<SampleTimer> make_cuda_timer(const CudaTimerOptions& options) {
  if (!cuda_device_present()) return nullptr;
  return std::make_unique<CudaEventTimer>(options);
}

void describe_cuda_device(Environment& environment) {
  for (auto& [key, value] : cuda_clock::describe_device()) environment.values[key] = value;
}

}  // namespace attnreplay
