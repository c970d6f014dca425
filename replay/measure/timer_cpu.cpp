// The CPU kernels' timer: the steady clock around each run, which finishes inside run().
#include <chrono>

#include "replay/measure/timers.h"

namespace attnreplay {
namespace {

class CpuClockTimer final : public SampleTimer {
 public:
  std::string method() const override { return "cpu-steady-clock"; }
  std::string cache() const override { return "n/a"; }
  std::vector<std::optional<double>> time_samples(PreparedKernel& kernel) override {
    const auto start = std::chrono::steady_clock::now();
    kernel.run();
    kernel.synchronize();
    return {std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
  }
};

}  // namespace

std::unique_ptr<SampleTimer> make_cpu_timer() { return std::make_unique<CpuClockTimer>(); }

}  // namespace attnreplay
