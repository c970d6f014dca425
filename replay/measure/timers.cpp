#include "replay/measure/timers.h"

#include <fmt/format.h>

#include <map>
#include <stdexcept>
#include <utility>

#include "replay/measure/gpu.h"

namespace attnreplay {

std::optional<TimingMethod> parse_timing_method(std::string_view text) {
  if (text == "event") return TimingMethod::event;
  if (text == "graph") return TimingMethod::graph;
  if (text == "cupti") return TimingMethod::cupti;
  if (text == "queued") return TimingMethod::queued;
  return std::nullopt;
}

std::string_view timing_method_flag(TimingMethod method) {
  switch (method) {
    case TimingMethod::event: return "event";
    case TimingMethod::graph: return "graph";
    case TimingMethod::cupti: return "cupti";
    case TimingMethod::queued: return "queued";
  }
  return "?";
}

std::string_view timing_method_label(TimingMethod method) {
  switch (method) {
    case TimingMethod::event: return "cuda-event";
    case TimingMethod::graph: return "cuda-graph";
    case TimingMethod::cupti: return "cupti";
    case TimingMethod::queued: return "cuda-event-queued";
  }
  return "?";
}

const std::vector<std::string>& timing_method_names() {
  static const std::vector<std::string> names{"event", "graph", "cupti", "queued"};
  return names;
}

std::unique_ptr<SampleTimer> make_cuda_timer(const CudaTimerOptions& options) {
#ifdef ATTNREPLAY_HAVE_CUDA
  if (!gpu_present()) throw std::runtime_error("no CUDA device");
  switch (options.method) {
    case TimingMethod::event: return make_event_timer(options);
    case TimingMethod::graph:
#ifdef ATTNREPLAY_TORCH_CUDA
      return make_graph_timer(options);
#else
      throw std::runtime_error("--timing graph is not available: this build's libtorch has no CUDA part");
#endif
    case TimingMethod::cupti:
#ifdef ATTNREPLAY_HAVE_CUPTI
      return make_cupti_timer(options);
#else
      throw std::runtime_error("--timing cupti is not available: CUPTI's header (cupti.h) was not found when this was built");
#endif
    case TimingMethod::queued: return make_queued_timer(options);
  }
  throw std::logic_error(fmt::format("make_cuda_timer: unknown timing method {}", static_cast<int>(options.method)));
#else
  static_cast<void>(options);
  throw std::runtime_error("CUDA timing is not available in this build");
#endif
}

SampleTimer& timer_for(std::string_view device, TimingMethod method, bool hot_l2) {
  static const std::unique_ptr<SampleTimer> cpu_timer = make_cpu_timer();
  if (device != "cuda") return *cpu_timer;
  static std::map<std::pair<TimingMethod, bool>, std::unique_ptr<SampleTimer>> cuda_timers;
  auto& timer = cuda_timers[{method, hot_l2}];
  if (!timer) timer = make_cuda_timer(CudaTimerOptions{!hot_l2, 0.75, method});
  return *timer;
}

}  // namespace attnreplay
