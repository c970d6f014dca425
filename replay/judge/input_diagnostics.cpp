#include "replay/judge/input_diagnostics.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "replay/judge/distribution.h"

namespace attnreplay {

double max_over_median(std::vector<double> values) {
  if (values.empty()) return 1.0;
  std::sort(values.begin(), values.end());
  const double largest = values.back();
  const double median = percentile(values, 0.5);
  if (median > 0) return largest / median;
  return largest > 0 ? std::numeric_limits<double>::infinity() : 1.0;
}

namespace {

// The amax of each group that holds rows: a partial block's unused per_thread groups would
// otherwise count as zeros and halve the median.
std::vector<double> group_amax(const HeadMatrix& x, QuantGranularity granularity, Int8Operand operand) {
  const Int8Matrix quantized = quantize_int8(x, granularity, operand);
  std::vector<bool> used(quantized.group_amax.size(), false);
  for (std::int64_t row = 0; row < x.rows; ++row) {
    used.at(static_cast<std::size_t>(int8_group_of_row(granularity, operand, row))) = true;
  }
  std::vector<double> amax;
  for (std::size_t g = 0; g < used.size(); ++g)
    if (used[g]) amax.push_back(quantized.group_amax[g]);
  return amax;
}

}  // namespace

InputDiagnostics diagnose_inputs(const AttentionCall& call, QuantGranularity granularity) {
  const AttentionShape s = call.shape();
  const HostTensor q = to_bhsd(call.q, call.layout);
  const HostTensor k = to_bhsd(call.k, call.layout);
  InputDiagnostics d;
  d.k_mean_outlier_ratio = d.k_mean_over_std = 1.0;
  d.q_amax_spread = d.k_amax_spread = d.k_smoothed_amax_spread = 1.0;
  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t h = 0; h < s.heads_kv; ++h) {
      HeadMatrix keys = head_as_floats(k, b, h);
      const std::vector<float> means = channel_means(keys);
      std::vector<double> abs_means(means.size()), stds(means.size());
      for (std::size_t c = 0; c < means.size(); ++c) {
        double squares = 0;  // around the mean, in double: the spread can be tiny against the mean
        for (std::int64_t j = 0; j < keys.rows; ++j) {
          const double centred = static_cast<double>(keys.row(j)[c]) - means[c];
          squares += centred * centred;
        }
        abs_means[c] = std::abs(static_cast<double>(means[c]));
        stds[c] = keys.rows > 0 ? std::sqrt(squares / static_cast<double>(keys.rows)) : 0.0;
      }
      const auto largest = std::max_element(abs_means.begin(), abs_means.end());
      const double ratio = max_over_median(abs_means);
      if (ratio > d.k_mean_outlier_ratio) {
        d.k_mean_outlier_ratio = ratio;
        d.k_outlier_batch = b, d.k_outlier_head = h;
        d.k_outlier_channel = largest == abs_means.end() ? 0 : largest - abs_means.begin();
      }
      if (largest != abs_means.end()) {
        std::vector<double> sorted_stds = stds;
        std::sort(sorted_stds.begin(), sorted_stds.end());
        const double median_std = percentile(sorted_stds, 0.5);
        const double over_std = median_std > 0 ? *largest / median_std
                                               : (*largest > 0 ? std::numeric_limits<double>::infinity() : 1.0);
        d.k_mean_over_std = std::max(d.k_mean_over_std, over_std);
      }
      d.k_amax_spread = std::max(d.k_amax_spread, max_over_median(group_amax(keys, granularity, Int8Operand::key)));
      subtract_channel_means(keys, means);
      d.k_smoothed_amax_spread =
          std::max(d.k_smoothed_amax_spread, max_over_median(group_amax(keys, granularity, Int8Operand::key)));
    }
    for (std::int64_t h = 0; h < s.heads_q; ++h) {
      d.q_amax_spread = std::max(
          d.q_amax_spread, max_over_median(group_amax(head_as_floats(q, b, h), granularity, Int8Operand::query)));
    }
  }
  return d;
}

}  // namespace attnreplay
