#pragma once
// The process's GPU as measurement sees it: whether there is one, which one a launcher's local
// rank takes, the monitor that reads its clocks while samples run, and its description for the
// records. A build without CUDA answers as a machine without a GPU.
#include <string>

#include "replay/measure/measure.h"
#include "replay/results.h"

namespace attnreplay {

bool gpu_present();
int gpu_count();  // the visible GPUs
// The process's GPU under a launcher (replay/run/sharding.h): the visible device its local rank
// names, modulo the count. Returns the device index, or -1 without a device.
int use_local_gpu(int local_rank);

// The NVML clock monitor of the current GPU (replay/measure/nvml_monitor.h), made on first use;
// null where NVML cannot be used (or there is no GPU), and gpu_clock_monitor_description() says why.
ClockMonitor* gpu_clock_monitor();
std::string gpu_clock_monitor_description();

// GPU name, SM count, clocks, memory, L2, driver and runtime versions, and the clock monitor;
// nothing without a GPU.
void describe_cuda_device(Environment& environment);

}  // namespace attnreplay
