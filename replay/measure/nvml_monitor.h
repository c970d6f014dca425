#pragma once
// The GPU's SM clock, power draw and power-cap state as the driver reports them (NVML), read every
// few milliseconds on a thread of its own while a kernel's samples run. NVML is the driver's
// library: it is loaded at run time, so that the binary runs where there is no driver at all.
#include <memory>
#include <string>

#include "replay/measure/measure.h"

namespace attnreplay {

struct NvmlMonitorResult {
  std::unique_ptr<ClockMonitor> monitor;  // null when NVML cannot be used here
  std::string description;                // "nvml" or why not, for the environment record
};

// The monitor of the GPU at `pci_bus_id` (as cudaDeviceGetPCIBusId writes it); when NVML knows
// only one GPU, that one.
NvmlMonitorResult make_nvml_monitor(const std::string& pci_bus_id, const char* library = "libnvidia-ml.so.1");

}  // namespace attnreplay
