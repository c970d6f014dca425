#pragma once
// The CUDA runtime side of GPU timing, behind a C++17 interface so that nvcc never sees the
// project's C++20 headers. replay/cuda_timing.cpp builds the SampleTimer on it.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace attnreplay::cuda_clock {

bool device_present();
int device_count();  // visible devices, 0 without
// Makes device `local_rank` modulo the visible ones current for this thread; returns it, or -1
// without a device. A launcher that gives each process one GPU (CUDA_VISIBLE_DEVICES) gets 0.
int use_local_device(int local_rank);
// Waits for all work on the current device; throws, naming the place, on a fault.
void device_synchronize();

struct Sample {
  double seconds = 0;  // between the events around the run
  double sm_mhz = 0;   // SM clock measured right after it
  // The blocking kernel let go before it was released: the run waited for the GPU while it was
  // being queued, so the sample may hold launch gaps.
  bool block_timed_out = false;
};

class EventClock {
 public:
  // The flush (when cold) zeroes twice the L2, or `min_flush_bytes` where more.
  explicit EventClock(bool cold_l2, std::size_t min_flush_bytes = 0);
  ~EventClock();
  EventClock(const EventClock&) = delete;
  EventClock& operator=(const EventClock&) = delete;
  // One sample on the default stream: the L2 flushed (when cold), run() between a start and a stop
  // event, then a probe of the SM clock. queue() queues it and lets it go without waiting for the
  // samples before it, so that the host queues a sample while the GPU runs the one before: a
  // decode-sized kernel's sample costs the GPU's time for it, not that plus the host's. With
  // `blocking`, the sample's work sits behind a kernel that holds the stream until queue() has
  // queued all of it, so that it runs back to back however slowly the host queues it (nvbench's
  // way). At most kPipelineDepth samples are queued; collect() waits for the oldest and reads it.
  // When run() throws, the sample is let go and dropped, and the exception goes on.
  static constexpr int kPipelineDepth = 2;
  void queue(bool blocking, const std::function<void()>& run);
  Sample collect();
  int queued() const { return queued_; }
  // One unblocked sample, queued and read at once (none may be queued before it).
  Sample time_one(const std::function<void()>& run);
  // For timers that bracket a run by other means (CUPTI): flushes the L2 (when cold) and waits
  // until the device is idle, so that nothing queued before the run overlaps it.
  void flush_and_wait();
  // Probes the SM clock now, as a sample does after its stop event, and waits for the reading.
  double probe_sm_mhz();

  // triton's do_bench's way, for --timing queued: `runs` samples queued back to back on the
  // default stream, each (when cold) the flush, a start event, run() and a stop event, with nothing
  // holding the stream and no wait between them, so that each counts what a loop of launches sees:
  // the run's own GPU time, and the host's launch latency where the GPU gets ahead of it. Then the
  // clock probe, one wait, and the readings. When run() throws, waits for what was queued and
  // rethrows.
  struct QueuedSamples {
    std::vector<double> seconds;  // each run's, in order
    double sm_mhz = 0;            // SM clock measured right after the last
  };
  QueuedSamples time_queued(int runs, const std::function<void()>& run);
  double rated_sm_mhz() const { return rated_mhz_; }

 private:
  struct Resources;
  std::unique_ptr<Resources> resources_;
  bool cold_l2_;
  double rated_mhz_ = 0;
  int oldest_ = 0;  // queue()'s slot of the oldest sample in flight
  int queued_ = 0;
};

// The current device's PCI bus id ("0000:00:06.0"), which NVML finds it by; empty if unknown.
std::string pci_bus_id();

// GPU name, compute capability, SM count, memory, L2, clocks, driver and runtime versions.
std::map<std::string, std::string> describe_device();

}  // namespace attnreplay::cuda_clock
