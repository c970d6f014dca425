#pragma once
// The timers behind --timing graph, cupti and queued, each in its own file, which the build leaves
// out where its dependency is missing (replay/CMakeLists.txt); make_cuda_timer() picks one.
#include <memory>

#include "replay/cuda_timing.h"

namespace attnreplay {

// replay/cuda_graph_timing.cpp, built when libtorch has CUDA.
std::unique_ptr<SampleTimer> make_cuda_graph_timer(const CudaTimerOptions& options);
// replay/cupti_timing.cpp, built when CUPTI's header is found; loads libcupti at run time.
std::unique_ptr<SampleTimer> make_cupti_timer(const CudaTimerOptions& options);
// replay/cuda_queued_timing.cpp, built with CUDA.
std::unique_ptr<SampleTimer> make_cuda_queued_timer(const CudaTimerOptions& options);

}  // namespace attnreplay
