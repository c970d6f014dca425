#include "capture/attention_clock.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

#ifdef ATTNCAP_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace attnreplay::capture {

struct AttentionClock::GpuCall {
#ifdef ATTNCAP_WITH_CUDA
  at::cuda::CUDAEvent begin{cudaEventDefault}, end{cudaEventDefault};
#endif
};

struct AttentionClock::Started {
  std::chrono::steady_clock::time_point wall_start = std::chrono::steady_clock::now();
  std::unique_ptr<GpuCall> gpu;  // set for a CUDA call
};

AttentionClock::AttentionClock() = default;
AttentionClock::~AttentionClock() = default;

std::shared_ptr<AttentionClock::Started> AttentionClock::start(const at::Tensor& input) {
  auto started = std::make_shared<Started>();
#ifdef ATTNCAP_WITH_CUDA
  if (input.is_cuda()) {
    started->gpu = std::make_unique<GpuCall>();
    started->gpu->begin.record(c10::cuda::getCurrentCUDAStream(input.device().index()));
  }
#else
  (void)input;
#endif
  started->wall_start = std::chrono::steady_clock::now();
  return started;
}

void AttentionClock::stop(Started& started, bool wall) {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started.wall_start).count();
#ifdef ATTNCAP_WITH_CUDA
  if (started.gpu && !wall) {
    started.gpu->end.record(c10::cuda::getCurrentCUDAStream(started.gpu->begin.device_index()));
    std::lock_guard lock(mutex_);
    gpu_calls_.push_back(std::move(started.gpu));
    return;
  }
#endif
  std::lock_guard lock(mutex_);
  wall_seconds_ += seconds;
  ++wall_calls_;
}

void AttentionClock::report() const {
  std::lock_guard lock(mutex_);
  double gpu_seconds = 0, first_seconds = 0;
#ifdef ATTNCAP_WITH_CUDA
  for (const auto& call : gpu_calls_) {
    call->end.synchronize();
    const double seconds = call->begin.elapsed_time(call->end) / 1e3;
    if (call == gpu_calls_.front()) first_seconds = seconds;
    gpu_seconds += seconds;
  }
#endif
  std::string parts;
  if (!gpu_calls_.empty()) {
    // The first call carries one-time costs (loading kernels, cuDNN's plans): said apart.
    parts = fmt::format("{:.6f} s of GPU time over {} calls (CUDA events on each call's stream; the first call "
                        "{:.6f} s)", gpu_seconds, gpu_calls_.size(), first_seconds);
  }
  if (wall_calls_ > 0 || gpu_calls_.empty()) {
    parts += fmt::format("{}{:.6f} s of wall time over {} calls (on the job's threads)", parts.empty() ? "" : ", ",
                         wall_seconds_, wall_calls_);
  }
  std::fprintf(stderr, "[attncap] pid %d: attention took %s\n", static_cast<int>(getpid()), parts.c_str());
}

}  // namespace attnreplay::capture
