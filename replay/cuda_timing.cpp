#include "replay/cuda_timing.h"

#include <fmt/format.h>

#include <stdexcept>

#include "replay/cuda_clock.h"
#include "replay/cuda_timers.h"
#include "replay/nvml_monitor.h"

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

bool cuda_device_present() { return cuda_clock::device_present(); }

int use_local_gpu(int local_rank) { return cuda_clock::use_local_device(local_rank); }

std::unique_ptr<SampleTimer> make_cuda_timer(const CudaTimerOptions& options) {
  if (!cuda_device_present()) return nullptr;
  switch (options.method) {
    case TimingMethod::event: return std::make_unique<CudaEventTimer>(options);
    case TimingMethod::graph:
#ifdef ATTNREPLAY_TORCH_CUDA
      return make_cuda_graph_timer(options);
#else
      throw std::runtime_error("--timing graph is not available: this build's libtorch has no CUDA part");
#endif
    case TimingMethod::cupti:
#ifdef ATTNREPLAY_HAVE_CUPTI
      return make_cupti_timer(options);
#else
      throw std::runtime_error("--timing cupti is not available: CUPTI's header (cupti.h) was not found when this was built");
#endif
    case TimingMethod::queued: return make_cuda_queued_timer(options);
  }
  throw std::logic_error(fmt::format("make_cuda_timer: unknown timing method {}", static_cast<int>(options.method)));
}

namespace {

const NvmlMonitorResult& nvml_monitor() {
  static const NvmlMonitorResult result = make_nvml_monitor(cuda_clock::pci_bus_id());
  return result;
}

}  // namespace

ClockMonitor* gpu_clock_monitor() { return nvml_monitor().monitor.get(); }

std::string gpu_clock_monitor_description() { return nvml_monitor().description; }

void describe_cuda_device(Environment& environment) {
  for (auto& [key, value] : cuda_clock::describe_device()) environment.values[key] = value;
  if (cuda_device_present()) environment.values["gpu_clock_monitor"] = gpu_clock_monitor_description();
}

}  // namespace attnreplay
