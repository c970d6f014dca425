#pragma once
// How long the job's attention takes, as the job runs it (ATTNCAP_TIME_ATTENTION; `attnreplay e2e`
// sets it in both its runs): a GPU call's time between CUDA events recorded on its stream before and
// after it (GPU time, and the job never waits for it), a CPU call's, or a substituted call's, wall
// time on the job's thread. Summed per kind and said at exit.
#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace attnreplay::capture {

class AttentionClock {
 public:
  AttentionClock();
  ~AttentionClock();
  struct Started;  // what start() recorded, for stop()
  // At a call's start, `input` being one of its tensors (its device says how it is timed).
  std::shared_ptr<Started> start(const at::Tensor& input);
  // At its end; `wall` makes it a wall-time call whatever its device (a substituted call, whose
  // kernel ran synchronously, its copies included).
  void stop(Started& started, bool wall);
  // "[attncap] pid N: attention took ...", reading the CUDA events (waiting for the last).
  void report() const;

 private:
  struct GpuCall;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<GpuCall>> gpu_calls_;
  double wall_seconds_ = 0;
  std::int64_t wall_calls_ = 0;
};

}  // namespace attnreplay::capture
