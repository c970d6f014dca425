#pragma once
// GPU timing: CUDA events around each run on the default stream, a cold L2 by default (a buffer
// twice the L2's size is zeroed before each sample, as nvbench does), and samples taken while the
// SM clock ran under 75 % of its rated clock discarded, as nvbench's throttle guard does.
#include <memory>
#include <optional>
#include <string>

#include "replay/results.h"
#include "replay/timing.h"

namespace attnreplay {

bool cuda_device_present();

struct CudaTimerOptions {
  bool cold_l2 = true;
  double throttle_threshold = 0.75;  // of the rated SM clock
};

// nullptr when no CUDA device is present (or CUDA was not built).
std::unique_ptr<SampleTimer> make_cuda_timer(const CudaTimerOptions& options);

// GPU name, SM count, clocks, memory, L2, driver and runtime versions; empty without a GPU.
void describe_cuda_device(Environment& environment);

}  // namespace attnreplay
