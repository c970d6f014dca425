#pragma once
// The sample timers, one per --timing method, each in a file of its own on one naming axis:
// timer_cpu.cpp (CPU kernels), timer_event.cpp (CUDA events, the default), timer_graph.cpp (a CUDA
// graph of K runs), timer_cupti.cpp (the kernel durations CUPTI records), timer_queued.cpp (runs
// queued back to back, triton's do_bench way). docs/metrics.md compares them. The GPU ones share
// the cold-L2 flush and the throttle guard (replay/measure/cuda_clock.h, timer_rules.h).
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "replay/measure/measure.h"

namespace attnreplay {

// --timing: how GPU kernels are timed (docs/metrics.md). CPU kernels always use the steady clock.
enum class TimingMethod {
  event,  // CUDA events around each run (default)
  graph,  // CUDA events around a CUDA graph of K runs, divided by K
  cupti,  // the GPU durations CUPTI records for the kernels one run launches, summed
  queued,  // CUDA events around each run, runs queued back to back unheld (triton's do_bench)
};

// The flag's value ("event", "graph", "cupti", "queued"), or nullopt for anything else.
std::optional<TimingMethod> parse_timing_method(std::string_view text);
std::string_view timing_method_flag(TimingMethod method);
// What results record as TimingSummary::method: "cuda-event", "cuda-graph", "cupti",
// "cuda-event-queued".
std::string_view timing_method_label(TimingMethod method);
const std::vector<std::string>& timing_method_names();


struct CudaTimerOptions {
  bool cold_l2 = true;  // graph samples are hot whatever this says: the runs replay back to back
  double throttle_threshold = 0.75;  // of the rated SM clock
  TimingMethod method = TimingMethod::event;
};

// The timer for kernels on `device` ("cpu" or "cuda") by `method`, made on first use and kept for
// the process (the CUDA ones allocate an L2 flush buffer). Throws std::runtime_error, saying why,
// when the method cannot work here (no GPU, CUPTI not loadable, graphs without libtorch's CUDA
// part): each GPU row then says why.
SampleTimer& timer_for(std::string_view device, TimingMethod method, bool hot_l2);

// A new timer of each kind; the CUDA ones exist in builds with CUDA, where they need a GPU.
std::unique_ptr<SampleTimer> make_cpu_timer();
std::unique_ptr<SampleTimer> make_cuda_timer(const CudaTimerOptions& options);  // by options.method
std::unique_ptr<SampleTimer> make_event_timer(const CudaTimerOptions& options);
std::unique_ptr<SampleTimer> make_graph_timer(const CudaTimerOptions& options);   // with libtorch's CUDA part
std::unique_ptr<SampleTimer> make_cupti_timer(const CudaTimerOptions& options);   // where cupti.h was found
std::unique_ptr<SampleTimer> make_queued_timer(const CudaTimerOptions& options);

}  // namespace attnreplay
