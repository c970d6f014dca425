#include "replay/measure/nvml_monitor.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stop_token>
#include <thread>
#include <utility>

namespace attnreplay {
namespace {

// The few entry points used, as NVML's C API documents them (nvml.h is not in every toolkit).
using NvmlReturn = int;  // NVML_SUCCESS is 0
struct NvmlDeviceRecord;
using NvmlDevice = NvmlDeviceRecord*;
constexpr int kNvmlClockSm = 1;                               // NVML_CLOCK_SM
constexpr unsigned long long kNvmlEventReasonSwPowerCap = 0x4;  // nvmlClocksEventReasonSwPowerCap

struct NvmlApi {
  void* library = nullptr;
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  NvmlReturn (*device_count)(unsigned*) = nullptr;
  NvmlReturn (*handle_by_index)(unsigned, NvmlDevice*) = nullptr;
  NvmlReturn (*handle_by_pci_bus_id)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*clock_info)(NvmlDevice, int, unsigned*) = nullptr;
  NvmlReturn (*power_usage)(NvmlDevice, unsigned*) = nullptr;  // milliwatts
  NvmlReturn (*event_reasons)(NvmlDevice, unsigned long long*) = nullptr;
  const char* (*error_string)(NvmlReturn) = nullptr;

  std::string error(NvmlReturn code) const {
    return error_string ? error_string(code) : fmt::format("NVML error {}", code);
  }
};

template <typename Function>
bool bind(void* library, const char* name, Function& function) {
  function = reinterpret_cast<Function>(dlsym(library, name));
  return function != nullptr;
}

class NvmlMonitor final : public ClockMonitor {
 public:
  NvmlMonitor(NvmlApi api, NvmlDevice device) : api_(api), device_(device) {}
  ~NvmlMonitor() override {
    stop();
    api_.shutdown();
    dlclose(api_.library);
  }

  void start() override {
    stop();  // also empties readings_
    thread_ = std::jthread([this](std::stop_token stop) { sample_until(stop); });
  }

  ClockReadings stop() noexcept override {
    if (thread_.joinable()) {
      thread_.request_stop();
      thread_.join();
    }
    return std::exchange(readings_, {});
  }

 private:
  // NVML refreshes its clock reading every few milliseconds; reading faster only repeats it.
  static constexpr std::chrono::milliseconds kPeriod{5};

  void sample_until(std::stop_token stop) {
    std::mutex mutex;
    std::condition_variable_any wake;
    std::unique_lock lock(mutex);
    // At least one reading, however short the window.
    do {
      unsigned mhz = 0, milliwatts = 0;
      unsigned long long reasons = 0;
      if (api_.clock_info(device_, kNvmlClockSm, &mhz) == 0 && mhz > 0) {
        readings_.sm_mhz.push_back(mhz);
        if (api_.event_reasons && api_.event_reasons(device_, &reasons) == 0 && (reasons & kNvmlEventReasonSwPowerCap)) {
          ++readings_.power_capped;
        }
      }
      if (api_.power_usage(device_, &milliwatts) == 0) readings_.power_w.push_back(milliwatts * 1e-3);
      // Sleeps one period, or less when stop is requested.
      wake.wait_for(lock, stop, kPeriod, [] { return false; });
    } while (!stop.stop_requested());
  }

  NvmlApi api_;
  NvmlDevice device_;
  ClockReadings readings_;  // written by the thread only while it runs
  std::jthread thread_;
};

}  // namespace

NvmlMonitorResult make_nvml_monitor(const std::string& pci_bus_id, const char* library) {
  NvmlApi api;
  api.library = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (!api.library) return {nullptr, fmt::format("unavailable: {} not loadable ({})", library, dlerror())};
  const bool bound = bind(api.library, "nvmlInit_v2", api.init) && bind(api.library, "nvmlShutdown", api.shutdown) &&
                     bind(api.library, "nvmlDeviceGetCount_v2", api.device_count) &&
                     bind(api.library, "nvmlDeviceGetHandleByIndex_v2", api.handle_by_index) &&
                     bind(api.library, "nvmlDeviceGetHandleByPciBusId_v2", api.handle_by_pci_bus_id) &&
                     bind(api.library, "nvmlDeviceGetClockInfo", api.clock_info) &&
                     bind(api.library, "nvmlDeviceGetPowerUsage", api.power_usage);
  // Optional: older drivers lack it, and only the capped share goes missing.
  bind(api.library, "nvmlDeviceGetCurrentClocksEventReasons", api.event_reasons);
  bind(api.library, "nvmlErrorString", api.error_string);
  if (!bound) {
    dlclose(api.library);
    return {nullptr, fmt::format("unavailable: {} lacks an NVML entry point used here", library)};
  }
  if (const NvmlReturn code = api.init(); code != 0) {
    const std::string why = api.error(code);
    dlclose(api.library);
    return {nullptr, fmt::format("unavailable: nvmlInit failed ({})", why)};
  }
  NvmlDevice device = nullptr;
  unsigned count = 0;
  if (api.handle_by_pci_bus_id(pci_bus_id.c_str(), &device) != 0 &&
      !(api.device_count(&count) == 0 && count == 1 && api.handle_by_index(0, &device) == 0)) {
    api.shutdown();
    dlclose(api.library);
    return {nullptr, fmt::format("unavailable: NVML does not know the GPU at PCI bus id '{}'", pci_bus_id)};
  }
  return {std::make_unique<NvmlMonitor>(api, device), "nvml"};
}

}  // namespace attnreplay
