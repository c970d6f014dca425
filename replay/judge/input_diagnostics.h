#pragma once
// What in a call's inputs makes quantized attention lose accuracy, measured with the quantized
// kernels' own steps (kernels/quantized_attention.h): K channels whose mean dwarfs the others (what
// Sage's K smoothing removes) and INT8 groups whose amax is far above the typical group's (their
// codes then resolve the typical values coarsely).
#include <cstdint>
#include <vector>

#include "formats/attention_call.h"
#include "kernels/quantized_attention.h"

namespace attnreplay {

struct InputDiagnostics {
  // Per kv head, over K's channels c with mean m_c (over keys) and std s_c: max |m_c| / median |m_c|
  // (how far the largest offset stands out) and max |m_c| / median s_c (how large it is against
  // the spread that carries the information). Each the largest over heads; 1 when all means are 0.
  double k_mean_outlier_ratio = 0;
  double k_mean_over_std = 0;
  // Where the largest outlier ratio sits.
  std::int64_t k_outlier_batch = 0, k_outlier_head = 0, k_outlier_channel = 0;
  // Per head, max / median of the INT8 group amax (--quant_gran's groups), the largest over heads:
  // for Q, for K as captured, and for K after smoothing (what Sage quantizes).
  double q_amax_spread = 0;
  double k_amax_spread = 0;
  double k_smoothed_amax_spread = 0;
};

// Any floating dtype and layout; GQA's kv heads are measured once each.
InputDiagnostics diagnose_inputs(const AttentionCall& call, QuantGranularity granularity);

// max / median of positive-or-zero values: 1 when both are 0, infinity when only the median is.
double max_over_median(std::vector<double> values);

}  // namespace attnreplay
