#pragma once
// GPU timing: CUDA events around each run on the default stream, a cold L2 by default (a buffer
// twice the L2's size is zeroed before each sample, as nvbench does), and samples taken while the
// SM clock ran under 75 % of its rated clock discarded, as nvbench's throttle guard does. Two other
// methods share the flush and the guard: CUDA graphs of K runs (replay/cuda_graph_timing.cpp) and
// CUPTI's kernel durations (replay/cupti_timing.cpp); docs/metrics.md compares them.
#include <memory>
#include <optional>
#include <string>

#include "replay/gpu_timing.h"
#include "replay/results.h"
#include "replay/timing.h"

namespace attnreplay {

bool cuda_device_present();
// The process's GPU under a launcher (replay/sharding.h): the visible device its local rank names,
// modulo the count. Returns the device index, or -1 without a device.
int use_local_gpu(int local_rank);

struct CudaTimerOptions {
  bool cold_l2 = true;  // graph samples are hot whatever this says: the runs replay back to back
  double throttle_threshold = 0.75;  // of the rated SM clock
  TimingMethod method = TimingMethod::event;
};

// nullptr when no CUDA device is present. Throws std::runtime_error, saying why, when the method
// cannot work here (CUPTI not loadable, or graphs without libtorch's CUDA part).
std::unique_ptr<SampleTimer> make_cuda_timer(const CudaTimerOptions& options);

// The NVML clock monitor of the current GPU (replay/nvml_monitor.h), made on first use; null where
// NVML cannot be used, and gpu_clock_monitor_description() says why.
ClockMonitor* gpu_clock_monitor();
std::string gpu_clock_monitor_description();

// GPU name, SM count, clocks, memory, L2, driver and runtime versions, and the clock monitor;
// empty without a GPU.
void describe_cuda_device(Environment& environment);

}  // namespace attnreplay
