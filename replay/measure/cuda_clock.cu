#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>

#include "kernels/cuda/cluster_occupancy.h"
#include "replay/measure/cuda_check.h"
#include "replay/measure/cuda_clock.h"

namespace attnreplay::cuda_clock {
namespace {

// Spins for ~20 us of wall time (the global timer) and counts SM cycles meanwhile: their ratio is
// the clock the SM ran at right after the sample.
__global__ void clock_probe(unsigned long long* cycles, unsigned long long* nanoseconds) {
  unsigned long long start_time, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start_time));
  const long long start_clock = clock64();
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start_time < 20000);
  *cycles = static_cast<unsigned long long>(clock64() - start_clock);
  *nanoseconds = now - start_time;
}

// nvbench's blocking kernel: holds the stream until the host has queued a whole sample, so that no
// launch latency (a Python kernel's, say) opens a gap between the events. A run() that waits for
// the GPU would wait for this too: after `timeout_ns` it lets go and says so.
__global__ void block_until_released(const volatile int* released, int* timed_out, unsigned long long timeout_ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    if (*released) return;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < timeout_ns);
  *timed_out = 1;
}

constexpr unsigned long long kBlockTimeoutNs = 100'000'000;  // far above any run's queueing time

// Launched by no one: what cudaOccupancyMaxActiveClusters asks about.
__global__ void cluster_probe() {}

// Clusters of `size` CTAs the GPU holds at once at one CTA an SM (each CTA takes all of an SM's
// shared memory): how its SMs are grouped, which can differ between GPUs of one model, and with
// it the speed of kernels launched in clusters. Added to tell whether H100s differed in it when
// fa3-fp8's preparation ran 11-15 % apart on them; those that recorded it did not, and the gap
// was the code's (docs/quantized.md). 0 where the GPU has no clusters or does not say.
int clusters_at_once(int size) {
  const auto unknown = [] {
    cudaGetLastError();
    return 0;
  };
  int device = 0, shared = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess ||
      cudaFuncSetAttribute(cluster_probe, cudaFuncAttributeMaxDynamicSharedMemorySize, shared) != cudaSuccess ||
      (size > 8 && cudaFuncSetAttribute(cluster_probe, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)) {
    return unknown();
  }
  return cuda_attention::max_active_clusters(cluster_probe, static_cast<unsigned>(size), 128,
                                             static_cast<std::size_t>(shared));
}

int attribute(cudaDeviceAttr which) {
  int device = 0, value = 0;
  cudaGetDevice(&device);
  if (cudaDeviceGetAttribute(&value, which, device) != cudaSuccess) value = 0;
  cudaGetLastError();
  return value;
}

}  // namespace

struct EventClock::Resources {
  void* flush = nullptr;
  size_t flush_bytes = 0;
  unsigned long long* probe = nullptr;  // probe_sm_mhz's and time_queued's
  std::vector<cudaEvent_t> starts, stops;  // time_queued's, grown to its largest batch and reused
  // queue()'s slots: the events around the run and after the probe; in host memory the device
  // writes (so that reading one slot waits for that slot alone): the release flag, the blocking
  // kernel's timed-out flag, and the probe's cycles and nanoseconds.
  struct Slot {
    cudaEvent_t start{}, stop{}, probed{};
    volatile int* flags = nullptr;
    int* device_flags = nullptr;
    volatile unsigned long long* probe = nullptr;
    unsigned long long* device_probe = nullptr;
  };
  Slot slots[EventClock::kPipelineDepth];
  ~Resources() {
    cudaFree(flush);
    cudaFree(probe);
    for (cudaEvent_t event : starts) cudaEventDestroy(event);
    for (cudaEvent_t event : stops) cudaEventDestroy(event);
    for (Slot& slot : slots) {
      cudaEventDestroy(slot.start);
      cudaEventDestroy(slot.stop);
      cudaEventDestroy(slot.probed);
      cudaFreeHost(const_cast<int*>(slot.flags));
      cudaFreeHost(const_cast<unsigned long long*>(slot.probe));
    }
  }
};

bool device_present() {
  int count = 0;
  const bool present = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();
  return present;
}

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  cudaGetLastError();
  return count;
}

int use_local_device(int local_rank) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return -1;
  }
  const int device = local_rank % count;
  ATTNREPLAY_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

EventClock::EventClock(bool cold_l2, size_t min_flush_bytes)
    : resources_(std::make_unique<Resources>()), cold_l2_(cold_l2) {
  rated_mhz_ = attribute(cudaDevAttrClockRate) / 1000.0;
  // Twice the L2, as nvbench flushes: every line of the cache is evicted by the zeroing.
  resources_->flush_bytes = std::max(min_flush_bytes, 2 * static_cast<size_t>(attribute(cudaDevAttrL2CacheSize)));
  if (cold_l2_) ATTNREPLAY_CUDA_CHECK(cudaMalloc(&resources_->flush, resources_->flush_bytes));
  ATTNREPLAY_CUDA_CHECK(cudaMalloc(&resources_->probe, 2 * sizeof(unsigned long long)));
  for (Resources::Slot& slot : resources_->slots) {
    ATTNREPLAY_CUDA_CHECK(cudaEventCreate(&slot.start));
    ATTNREPLAY_CUDA_CHECK(cudaEventCreate(&slot.stop));
    ATTNREPLAY_CUDA_CHECK(cudaEventCreateWithFlags(&slot.probed, cudaEventDisableTiming));
    int* slot_flags = nullptr;
    ATTNREPLAY_CUDA_CHECK(cudaHostAlloc(&slot_flags, 2 * sizeof(int), cudaHostAllocMapped));
    slot.flags = slot_flags;
    ATTNREPLAY_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&slot.device_flags), slot_flags, 0));
    unsigned long long* probe = nullptr;
    ATTNREPLAY_CUDA_CHECK(cudaHostAlloc(&probe, 2 * sizeof(unsigned long long), cudaHostAllocMapped));
    slot.probe = probe;
    ATTNREPLAY_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&slot.device_probe), probe, 0));
  }
}

EventClock::~EventClock() = default;

namespace {

// Launches the probe on the default stream, after whatever is queued there.
void launch_probe(unsigned long long* probe) {
  clock_probe<<<1, 1>>>(probe, probe + 1);
  ATTNREPLAY_CUDA_CHECK(cudaGetLastError());
}

// Reads what the probe wrote (the copy waits for it): cycles over nanoseconds, in MHz.
double read_probe(const unsigned long long* device_probe) {
  unsigned long long probe[2] = {0, 0};
  ATTNREPLAY_CUDA_CHECK(cudaMemcpy(probe, device_probe, sizeof(probe), cudaMemcpyDeviceToHost));
  return probe[1] ? static_cast<double>(probe[0]) / static_cast<double>(probe[1]) * 1e3 : 0.0;
}

}  // namespace

void EventClock::queue(bool blocking, const std::function<void()>& run) {
  if (queued_ == kPipelineDepth) throw std::logic_error("EventClock::queue: the pipeline is full; collect() first");
  Resources::Slot& slot = resources_->slots[(oldest_ + queued_) % kPipelineDepth];
  // The slot's last sample was collected: its blocking kernel has read the flags for the last time.
  slot.flags[0] = blocking ? 0 : 1;
  slot.flags[1] = 0;
  const auto let_go = [&] {
    __sync_synchronize();  // everything queued before the flag is seen
    slot.flags[0] = 1;
  };
  try {
    if (blocking) {
      block_until_released<<<1, 1>>>(slot.device_flags, slot.device_flags + 1, kBlockTimeoutNs);
      ATTNREPLAY_CUDA_CHECK(cudaGetLastError());
    }
    if (cold_l2_) ATTNREPLAY_CUDA_CHECK(cudaMemsetAsync(resources_->flush, 0, resources_->flush_bytes, 0));
    ATTNREPLAY_CUDA_CHECK(cudaEventRecord(slot.start, 0));
    run();
    ATTNREPLAY_CUDA_CHECK(cudaEventRecord(slot.stop, 0));
    slot.probe[0] = slot.probe[1] = 0;
    clock_probe<<<1, 1>>>(slot.device_probe, slot.device_probe + 1);
    ATTNREPLAY_CUDA_CHECK(cudaGetLastError());
    ATTNREPLAY_CUDA_CHECK(cudaEventRecord(slot.probed, 0));
  } catch (...) {
    let_go();
    throw;
  }
  let_go();
  ++queued_;
}

Sample EventClock::collect() {
  if (queued_ == 0) throw std::logic_error("EventClock::collect: no sample queued");
  Resources::Slot& slot = resources_->slots[oldest_];
  oldest_ = (oldest_ + 1) % kPipelineDepth;
  --queued_;
  ATTNREPLAY_CUDA_CHECK(cudaEventSynchronize(slot.probed));
  float milliseconds = 0;
  ATTNREPLAY_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, slot.start, slot.stop));
  Sample sample;
  sample.seconds = milliseconds * 1e-3;
  const unsigned long long cycles = slot.probe[0], nanoseconds = slot.probe[1];
  sample.sm_mhz = nanoseconds ? static_cast<double>(cycles) / static_cast<double>(nanoseconds) * 1e3 : 0.0;
  sample.block_timed_out = slot.flags[1] != 0;
  return sample;
}

Sample EventClock::time_one(const std::function<void()>& run) {
  if (queued_ != 0) throw std::logic_error("EventClock::time_one: samples are queued; collect() them first");
  queue(/*blocking=*/false, run);
  return collect();
}

void EventClock::flush_and_wait() {
  if (cold_l2_) ATTNREPLAY_CUDA_CHECK(cudaMemsetAsync(resources_->flush, 0, resources_->flush_bytes, 0));
  device_synchronize();
}

double EventClock::probe_sm_mhz() {
  launch_probe(resources_->probe);
  return read_probe(resources_->probe);
}

EventClock::QueuedSamples EventClock::time_queued(int runs, const std::function<void()>& run) {
  Resources& r = *resources_;
  while (static_cast<int>(r.starts.size()) < runs) {
    cudaEvent_t start{}, stop{};
    ATTNREPLAY_CUDA_CHECK(cudaEventCreate(&start));
    r.starts.push_back(start);
    ATTNREPLAY_CUDA_CHECK(cudaEventCreate(&stop));
    r.stops.push_back(stop);
  }
  for (int i = 0; i < runs; ++i) {
    if (cold_l2_) ATTNREPLAY_CUDA_CHECK(cudaMemsetAsync(r.flush, 0, r.flush_bytes, 0));
    ATTNREPLAY_CUDA_CHECK(cudaEventRecord(r.starts[i], 0));
    try {
      run();
    } catch (...) {
      // The runs queued before still hold the events and the flush buffer.
      cudaDeviceSynchronize();
      cudaGetLastError();
      throw;
    }
    ATTNREPLAY_CUDA_CHECK(cudaEventRecord(r.stops[i], 0));
  }
  launch_probe(r.probe);
  QueuedSamples samples;
  samples.sm_mhz = read_probe(r.probe);  // its copy waits for every run before the probe
  samples.seconds.reserve(runs);
  for (int i = 0; i < runs; ++i) {
    float milliseconds = 0;
    ATTNREPLAY_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, r.starts[i], r.stops[i]));
    samples.seconds.push_back(milliseconds * 1e-3);
  }
  return samples;
}

void device_synchronize() { ATTNREPLAY_CUDA_CHECK(cudaDeviceSynchronize()); }

std::string pci_bus_id() {
  int device = 0;
  char id[32] = {};
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetPCIBusId(id, sizeof(id), device) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  return id;
}

std::map<std::string, std::string> describe_device() {
  std::map<std::string, std::string> v;
  if (!device_present()) return v;
  int device = 0;
  cudaGetDevice(&device);
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, device) != cudaSuccess) return v;
  v["gpu"] = properties.name;
  v["gpu_compute_capability"] = std::to_string(properties.major) + "." + std::to_string(properties.minor);
  v["gpu_sm_count"] = std::to_string(properties.multiProcessorCount);
  v["gpu_memory_bytes"] = std::to_string(properties.totalGlobalMem);
  v["gpu_l2_bytes"] = std::to_string(properties.l2CacheSize);
  v["gpu_sm_clock_rated_mhz"] = std::to_string(attribute(cudaDevAttrClockRate) / 1000);
  v["gpu_memory_clock_mhz"] = std::to_string(attribute(cudaDevAttrMemoryClockRate) / 1000);
  if (properties.major >= 9) {
    v["gpu_clusters_of_8_at_once"] = std::to_string(clusters_at_once(8));
    v["gpu_clusters_of_16_at_once"] = std::to_string(clusters_at_once(16));
  }
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  v["cuda_driver"] = std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10);
  v["cuda_runtime"] = std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10);
  return v;
}

}  // namespace attnreplay::cuda_clock
