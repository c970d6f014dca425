#pragma once
// The GPU's own ceilings, measured at start-up with the same timer as the kernels: matrix rates
// (bf16, fp8, int8) and copy bandwidth. Percent of these, not of datasheet figures, is what the
// report shows beside TFLOP/s and GB/s.
#include "replay/results.h"

namespace attnreplay {

// Zeros without a GPU; a rate that cannot be measured (no fp8 on the chip, say) stays 0.
Ceilings measure_ceilings();

}  // namespace attnreplay
