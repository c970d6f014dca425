#include "replay/measure/gpu.h"

#ifdef ATTNREPLAY_HAVE_CUDA
#include "replay/measure/cuda_clock.h"
#include "replay/measure/nvml_monitor.h"
#endif

namespace attnreplay {

#ifdef ATTNREPLAY_HAVE_CUDA

bool gpu_present() { return cuda_clock::device_present(); }
int gpu_count() { return cuda_clock::device_count(); }

int use_local_gpu(int local_rank) { return cuda_clock::use_local_device(local_rank); }

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
  if (gpu_present()) environment.values["gpu_clock_monitor"] = gpu_clock_monitor_description();
}

#else

bool gpu_present() { return false; }
int gpu_count() { return 0; }
int use_local_gpu(int) { return -1; }
ClockMonitor* gpu_clock_monitor() { return nullptr; }
std::string gpu_clock_monitor_description() { return "this build has no CUDA"; }
void describe_cuda_device(Environment&) {}

#endif

}  // namespace attnreplay
