// --timing graph: K runs of a kernel captured into one CUDA graph, replayed with CUDA events around
// each replay; a sample is the replay's time over K. Launch gaps between runs vanish, as they do
// for a model that replays graphs. Capture goes through torch's CUDAGraph, which gives torch's
// caching allocator a private pool for the outputs run() allocates, on a side stream made current
// (torch kernels queue on the current stream; torch refuses to capture on the default one).
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/core/CachingHostAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <stdexcept>

#include "replay/measure/cuda_check.h"
#include "replay/measure/cuda_clock.h"
#include "replay/measure/timer_rules.h"
#include "replay/measure/timers.h"

namespace attnreplay {
namespace {

constexpr std::string_view kNotCapturable = "not capturable in a CUDA graph: ";

class CudaGraphTimer final : public SampleTimer {
 public:
  explicit CudaGraphTimer(const CudaTimerOptions& options)
      : clock_(/*cold_l2=*/false), guard_(clock_.rated_sm_mhz(), options.throttle_threshold) {}
  ~CudaGraphTimer() override { end_kernel(); }
  std::string method() const override { return std::string(timing_method_label(TimingMethod::graph)); }
  // The L2 cannot be flushed between runs inside one replay, and a flush before each replay would
  // make only its first run cold: every graph sample is a hot-L2 sample.
  std::string cache() const override { return "hot-l2"; }
  int runs_per_sample() const override { return runs_; }

  void begin_kernel(PreparedKernel& kernel) override {
    try {
      start(kernel);
    } catch (const c10::Error& error) {
      // torch's what() carries a C++ backtrace; the message is what the user needs.
      throw std::runtime_error(error.what_without_backtrace());
    }
  }

  void end_kernel() noexcept override {
    if (!graph_) return;
    // Replays may still be running on the memory the graph's pool gives back.
    cudaDeviceSynchronize();
    cudaGetLastError();
    try {
      graph_.reset();
    } catch (...) {
      // Destroying a graph only warns in torch; nothing here can do better than go on.
    }
  }

  std::vector<std::optional<double>> time_samples(PreparedKernel& /*kernel*/) override {
    if (!graph_) throw std::logic_error("CudaGraphTimer::time_samples before begin_kernel");
    // Replayed on the default stream, where the clock's events and probe are.
    const cuda_clock::Sample sample = clock_.time_one([this] {
      try {
        graph_->replay();
      } catch (const c10::Error& error) {
        throw std::runtime_error(error.what_without_backtrace());
      }
    });
    if (!guard_.accept(sample.sm_mhz)) return {std::nullopt};
    return {sample.seconds / runs_};
  }

 private:
  void start(PreparedKernel& kernel) {
    end_kernel();
    if (!kernel.runs_on_current_stream()) {
      throw std::runtime_error(fmt::format(
          "{}the kernel queues its work on the legacy default stream, which a capture on another stream does not "
          "record (a kernel opts in with PreparedKernel::runs_on_current_stream(), docs/kernels.md)",
          kNotCapturable));
    }
    runs_ = runs_filling(estimate_single_run_s(kernel), /*target_s=*/1e-3, /*max_runs=*/100);
    capture(kernel);
    // The first launch uploads the graph to the device: not a sample.
    graph_->replay();
    cuda_clock::device_synchronize();
  }

  // The median of three runs, on the default stream and hot: the kernel was warmed up already.
  double estimate_single_run_s(PreparedKernel& kernel) {
    std::array<double, 3> seconds{};
    for (double& s : seconds) s = clock_.time_one([&kernel] { kernel.run(); }).seconds;
    std::sort(seconds.begin(), seconds.end());
    return seconds[1];
  }

  void capture(PreparedKernel& kernel) {
    cuda_clock::device_synchronize();  // the side stream does not wait for the default stream
    const c10::DeviceIndex device = c10::cuda::current_device();
    const at::cuda::CUDAStream stream = at::cuda::getStreamFromPool(/*isHighPriority=*/false, device);
    c10::cuda::CUDAStreamGuard current(stream);
    // torch's advice before a capture: run once on the capture stream, so that what is made lazily
    // per stream (cuBLAS workspaces, cuDNN handles' streams) is made outside the capture.
    kernel.run();
    ATTNREPLAY_CUDA_CHECK(cudaStreamSynchronize(stream.stream()));

    auto graph = std::make_unique<at::cuda::CUDAGraph>(/*keep_graph=*/true);
    const c10::MempoolId_t pool = at::cuda::graph_pool_handle();
    // Thread-local mode: a synchronizing call in run() fails the capture (and is reported) instead
    // of being captured wrongly, and no other thread's calls are affected.
    graph->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
    try {
      for (int i = 0; i < runs_; ++i) kernel.run();
      graph->capture_end();
    } catch (const c10::Error& error) {
      abandon(std::move(graph), stream.stream(), device, pool);
      throw std::runtime_error(fmt::format("{}{}", kNotCapturable, error.what_without_backtrace()));
    } catch (const std::exception& error) {
      abandon(std::move(graph), stream.stream(), device, pool);
      throw std::runtime_error(fmt::format("{}{}", kNotCapturable, error.what()));
    }
    std::size_t nodes = 0;
    ATTNREPLAY_CUDA_CHECK(cudaGraphGetNodes(graph->raw_cuda_graph(), nullptr, &nodes));
    if (nodes == 0) {
      throw std::runtime_error(fmt::format("{}run() queued nothing on the current stream", kNotCapturable));
    }
    graph->instantiate();
    graph_ = std::move(graph);
  }

  // After a failed capture: end it if it is still on, and take the allocators out of capture mode.
  // The CUDAGraph object is kept, not destroyed: torch's allocators may still hold a filter that
  // refers to it, and a failed capture leaves it in a state its destructor does not expect.
  static void abandon(std::unique_ptr<at::cuda::CUDAGraph> graph, cudaStream_t stream, c10::DeviceIndex device,
                      c10::MempoolId_t pool) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      cudaGraph_t partial = nullptr;
      if (cudaStreamEndCapture(stream, &partial) == cudaSuccess && partial) cudaGraphDestroy(partial);
    }
    cudaGetLastError();
    // Each throws when capture_end() got as far as ending it already: then there is nothing to do.
    try {
      c10::cuda::CUDACachingAllocator::endAllocateToPool(device, pool);
    } catch (const std::exception&) {
    }
    try {
      at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(pool);
    } catch (const std::exception&) {
    }
    static_cast<void>(graph.release());
  }

  cuda_clock::EventClock clock_;
  ThrottleGuard guard_;
  std::unique_ptr<at::cuda::CUDAGraph> graph_;
  int runs_ = 1;
};

}  // namespace

std::unique_ptr<SampleTimer> make_graph_timer(const CudaTimerOptions& options) {
  return std::make_unique<CudaGraphTimer>(options);
}

}  // namespace attnreplay
