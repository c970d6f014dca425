// A stand-in for the driver's NVML with one GPU, for replay/measure/nvml_monitor.cpp's unit tests on
// machines without a driver: the monitor loads it by path. Its GPU is at PCI bus id
// 0000:00:06.0, runs at 1605 MHz and draws 700 W, with the power cap holding its clock down.
#include <cstring>

extern "C" {

struct nvmlDevice_st {};
static nvmlDevice_st the_gpu;
static int initialized = 0;

int nvmlInit_v2() { return ++initialized, 0; }
int nvmlShutdown() { return --initialized, 0; }
int nvmlDeviceGetCount_v2(unsigned* count) { return *count = 1, 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_st** device) {
  if (index != 0) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *device = &the_gpu;
  return 0;
}
int nvmlDeviceGetHandleByPciBusId_v2(const char* id, nvmlDevice_st** device) {
  if (std::strcmp(id, "0000:00:06.0") != 0) return 6;  // NVML_ERROR_NOT_FOUND
  *device = &the_gpu;
  return 0;
}
int nvmlDeviceGetClockInfo(nvmlDevice_st* device, int type, unsigned* mhz) {
  if (device != &the_gpu || type != 1 || initialized != 1) return 2;
  return *mhz = 1605, 0;
}
int nvmlDeviceGetPowerUsage(nvmlDevice_st* device, unsigned* milliwatts) {
  if (device != &the_gpu) return 2;
  return *milliwatts = 700000, 0;
}
int nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_st* device, unsigned long long* reasons) {
  if (device != &the_gpu) return 2;
  return *reasons = 0x4, 0;  // the software power cap
}
const char* nvmlErrorString(int code) { return code == 0 ? "Success" : "fake NVML error"; }
}
