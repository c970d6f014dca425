// --timing cupti: kernel-only timing, FlashInfer's default. CUPTI's activity records give the GPU
// start and end of every kernel, copy and set; a sample is the sum of the durations of the work
// queued by the API calls one run() makes, found by correlation id (replay/measure/timer_rules.h), so the
// L2 flush before it and the clock probe after it are left out. Launch gaps are not counted.
//
// CUPTI is loaded with dlopen, not linked: libtorch_cpu already needs libcupti.so.13, so the
// soname finds the copy torch loaded (its wheel's, under nvidia/cu13/lib), with no second CUPTI in
// the process; and where none can be loaded, the rows say so instead of the program not starting.
#include <cupti.h>
#include <dlfcn.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "replay/measure/cuda_clock.h"
#include "replay/measure/timer_rules.h"
#include "replay/measure/timers.h"

namespace attnreplay {
namespace {

// The CUPTI functions used here, each member named as the function it points to.
struct CuptiLibrary {
  std::string error;  // why it could not be loaded; empty when it was
  decltype(&::cuptiGetVersion) cuptiGetVersion = nullptr;
  decltype(&::cuptiGetResultString) cuptiGetResultString = nullptr;
  decltype(&::cuptiActivityRegisterCallbacks) cuptiActivityRegisterCallbacks = nullptr;
  decltype(&::cuptiActivityEnable) cuptiActivityEnable = nullptr;
  decltype(&::cuptiActivityDisable) cuptiActivityDisable = nullptr;
  decltype(&::cuptiActivityFlushAll) cuptiActivityFlushAll = nullptr;
  decltype(&::cuptiActivityGetNextRecord) cuptiActivityGetNextRecord = nullptr;
  decltype(&::cuptiActivityGetNumDroppedRecords) cuptiActivityGetNumDroppedRecords = nullptr;
  decltype(&::cuptiGetTimestamp) cuptiGetTimestamp = nullptr;
};

CuptiLibrary load_cupti() {
  CuptiLibrary api;
  void* library = nullptr;
  std::string tried;
  for (const char* name : {"libcupti.so.13", "libcupti.so"}) {
    library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (library) break;
    const char* why = dlerror();
    tried += fmt::format("{}{}", tried.empty() ? "" : "; ", why ? why : name);
  }
  if (!library) {
    api.error = fmt::format("cannot load CUPTI ({}); it ships with the CUDA toolkit and with torch's CUDA wheels "
                            "(nvidia/cu13/lib): put its folder on LD_LIBRARY_PATH",
                            tried);
    return api;
  }
  // The library stays loaded for the life of the process: records arrive through callbacks in it.
  std::vector<std::string> missing;
  auto find = [&](auto& pointer, const char* name) {
    pointer = reinterpret_cast<std::remove_reference_t<decltype(pointer)>>(dlsym(library, name));
    if (!pointer) missing.emplace_back(name);
  };
  find(api.cuptiGetVersion, "cuptiGetVersion");
  find(api.cuptiGetResultString, "cuptiGetResultString");
  find(api.cuptiActivityRegisterCallbacks, "cuptiActivityRegisterCallbacks");
  find(api.cuptiActivityEnable, "cuptiActivityEnable");
  find(api.cuptiActivityDisable, "cuptiActivityDisable");
  find(api.cuptiActivityFlushAll, "cuptiActivityFlushAll");
  find(api.cuptiActivityGetNextRecord, "cuptiActivityGetNextRecord");
  find(api.cuptiActivityGetNumDroppedRecords, "cuptiActivityGetNumDroppedRecords");
  find(api.cuptiGetTimestamp, "cuptiGetTimestamp");
  if (!missing.empty()) {
    api.error = fmt::format("the CUPTI loaded lacks {}", fmt::join(missing, ", "));
    return api;
  }
  // The records are read as this header lays them out, which holds within one major version.
  std::uint32_t version = 0;
  if (api.cuptiGetVersion(&version) != CUPTI_SUCCESS || version / 10000 != CUPTI_API_VERSION / 10000) {
    api.error = fmt::format("the CUPTI loaded has API version {}, but this build reads records of version {}.x",
                            version, CUPTI_API_VERSION / 10000);
  }
  return api;
}

const CuptiLibrary& cupti() {
  static const CuptiLibrary api = load_cupti();
  return api;
}

void check_cupti(CUptiResult status, const char* call, const char* file, int line) {
  if (status == CUPTI_SUCCESS) return;
  const char* text = nullptr;
  if (cupti().cuptiGetResultString) cupti().cuptiGetResultString(status, &text);
  throw std::runtime_error(fmt::format("{}:{}: {} failed: {} ({})", file, line, call, text ? text : "unknown CUPTI error",
                                       static_cast<int>(status)));
}

// Calls a CUPTI function through the loaded library; its error names the place and the call.
#define ATTNREPLAY_CUPTI_CALL(function, ...) \
  check_cupti(cupti().function(__VA_ARGS__), #function "(" #__VA_ARGS__ ")", __FILE__, __LINE__)

// Where the buffer callbacks, which CUPTI may call from a thread of its own, leave the records.
struct Collected {
  std::mutex mutex;
  std::vector<ActivityRecord> records;
  std::size_t dropped = 0;
};

Collected& collected() {
  static Collected c;
  return c;
}

constexpr std::size_t kBufferBytes = 8u << 20;
constexpr std::size_t kBufferAlignment = 8;  // what CUPTI requires of activity buffers

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(kBufferAlignment, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;  // a size of 0 makes CUPTI drop records, which are counted
  *max_records = 0;
}

// Must not throw: it runs inside CUPTI.
void CUPTIAPI buffer_completed(CUcontext context, std::uint32_t stream_id, std::uint8_t* buffer, std::size_t /*size*/,
                               std::size_t valid_size) {
  std::vector<ActivityRecord> parsed;
  CUpti_Activity* record = nullptr;
  while (buffer && cupti().cuptiActivityGetNextRecord(buffer, valid_size, &record) == CUPTI_SUCCESS) {
    ActivityRecord r;
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_RUNTIME:
      case CUPTI_ACTIVITY_KIND_DRIVER: {
        const auto* api = reinterpret_cast<const CUpti_ActivityAPI*>(record);
        r = {ActivityRecord::Kind::api, api->correlationId, api->start, api->end};
        break;
      }
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        r = {ActivityRecord::Kind::kernel, kernel->correlationId, kernel->start, kernel->end};
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* copy = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        r = {ActivityRecord::Kind::memcpy, copy->correlationId, copy->start, copy->end};
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* set = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        r = {ActivityRecord::Kind::memset, set->correlationId, set->start, set->end};
        break;
      }
      default: continue;
    }
    parsed.push_back(r);
  }
  std::size_t dropped = 0;
  if (cupti().cuptiActivityGetNumDroppedRecords(context, stream_id, &dropped) != CUPTI_SUCCESS) dropped = 0;
  std::free(buffer);
  std::lock_guard<std::mutex> lock(collected().mutex);
  Collected& c = collected();
  c.records.insert(c.records.end(), parsed.begin(), parsed.end());
  c.dropped += dropped;
}

// What one run's work is attributed through: the API calls (host side) and the work they queue.
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER,
                                         CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};

// Registers the buffer callbacks once for the process (CUPTI keeps one pair).
void register_callbacks() {
  static std::once_flag once;
  std::call_once(once, [] { ATTNREPLAY_CUPTI_CALL(cuptiActivityRegisterCallbacks, buffer_requested, buffer_completed); });
}

// Delivers every buffer to buffer_completed, then hands over what was collected.
std::pair<std::vector<ActivityRecord>, std::size_t> flush_records() {
  // Forced: the device was synchronized, so every record is complete; without it CUPTI may hold
  // back a buffer that is not full.
  ATTNREPLAY_CUPTI_CALL(cuptiActivityFlushAll, CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(collected().mutex);
  Collected& c = collected();
  std::pair<std::vector<ActivityRecord>, std::size_t> taken{std::move(c.records), c.dropped};
  c.records.clear();
  c.dropped = 0;
  return taken;
}

class CuptiTimer final : public SampleTimer {
 public:
  explicit CuptiTimer(const CudaTimerOptions& options)
      : options_(options), clock_(options.cold_l2), guard_(clock_.rated_sm_mhz(), options.throttle_threshold) {}
  ~CuptiTimer() override { end_kernel(); }
  std::string method() const override { return std::string(timing_method_label(TimingMethod::cupti)); }
  std::string cache() const override { return options_.cold_l2 ? "cold-l2" : "hot-l2"; }

  void begin_kernel(PreparedKernel& /*kernel*/) override {
    end_kernel();
    enabled_ = true;
    runs_per_batch_ = 1;
    for (CUpti_ActivityKind kind : kKinds) ATTNREPLAY_CUPTI_CALL(cuptiActivityEnable, kind);
    flush_records();  // nothing from before this kernel
  }

  void end_kernel() noexcept override {
    if (!enabled_) return;
    enabled_ = false;
    // Tracing API calls costs host time: it is on only while a kernel is sampled.
    for (CUpti_ActivityKind kind : kKinds) cupti().cuptiActivityDisable(kind);
    try {
      flush_records();
    } catch (const std::exception&) {
      // Records left behind are dropped at the next begin_kernel's flush.
    }
  }

  // Runs `runs_per_batch_` samples, then reads CUPTI's records once for all of them: a forced flush
  // costs about 1 ms of host time, and with one a sample, sampling of 15 us calls ended at the
  // rule's timeout after 15,000 samples. A batch is sized from the first sample to about 20 ms of
  // runs, at most 64.
  std::vector<std::optional<double>> time_samples(PreparedKernel& kernel) override {
    if (!enabled_) throw std::logic_error("CuptiTimer::time_samples before begin_kernel");
    std::vector<std::pair<std::uint64_t, std::uint64_t>> windows;
    for (int i = 0; i < runs_per_batch_; ++i) {
      // The flush is done, and the device idle, before the window opens.
      clock_.flush_and_wait();
      std::uint64_t begin_ns = 0, end_ns = 0;
      ATTNREPLAY_CUPTI_CALL(cuptiGetTimestamp, &begin_ns);
      kernel.run();
      kernel.synchronize();
      cuda_clock::device_synchronize();
      ATTNREPLAY_CUPTI_CALL(cuptiGetTimestamp, &end_ns);
      windows.emplace_back(begin_ns, end_ns);
    }
    auto [records, dropped] = flush_records();
    // After the windows close: the probe's launch is outside them, so its kernel is not counted.
    const bool throttled = !guard_.accept(clock_.probe_sm_mhz());
    std::vector<std::optional<double>> samples;
    for (const auto& [begin_ns, end_ns] : windows) {
      const RunGpuTime time = gpu_time_of_run(records, begin_ns, end_ns);
      if (time.device_records == 0) {
        throw std::runtime_error(fmt::format(
            "CUPTI recorded no GPU work for one run ({} activity records flushed{})", records.size(),
            dropped ? fmt::format(", {} dropped", dropped) : std::string()));
      }
      // A run CUPTI did not record in full cannot be timed; it is discarded, and counted. Dropped
      // records cannot be told apart by run: they discard the batch.
      const bool timed = dropped == 0 && time.untimed_records == 0 && !throttled;
      samples.push_back(timed ? std::optional<double>(time.busy_s) : std::nullopt);
      if (runs_per_batch_ == 1 && timed) runs_per_batch_ = runs_filling(time.busy_s, /*target_s=*/0.02, /*max_runs=*/64);
    }
    return samples;
  }

 private:
  CudaTimerOptions options_;
  cuda_clock::EventClock clock_;
  ThrottleGuard guard_;
  bool enabled_ = false;
  int runs_per_batch_ = 1;
};

}  // namespace

std::unique_ptr<SampleTimer> make_cupti_timer(const CudaTimerOptions& options) {
  const CuptiLibrary& api = cupti();
  if (!api.error.empty()) throw std::runtime_error("--timing cupti is not available: " + api.error);
  register_callbacks();
  return std::make_unique<CuptiTimer>(options);
}

}  // namespace attnreplay
