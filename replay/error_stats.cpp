#include "replay/error_stats.h"

#include <algorithm>
#include <cmath>

#include "formats/errors.h"

namespace attnreplay {
namespace {

// Welford's running mean and variance: one pass, no cancellation on large tensors.
struct Running {
  std::int64_t count = 0;
  double mean = 0, m2 = 0;
  double min = INFINITY, max = -INFINITY;
  void add(double x) {
    ++count;
    const double delta = x - mean;
    mean += delta / static_cast<double>(count);
    m2 += delta * (x - mean);
    min = std::min(min, x);
    max = std::max(max, x);
  }
  TensorMoments moments() const {
    if (count == 0) return {};
    return {min, max, mean, std::sqrt(m2 / static_cast<double>(count))};
  }
};

double relative_l2(double sum_sq_error, double sum_sq_ref) {
  return sum_sq_ref > 0 ? std::sqrt(sum_sq_error / sum_sq_ref) : (sum_sq_error > 0 ? INFINITY : 0.0);
}

// 1 when both are zero: nothing to tell apart.
double cosine_of(double dot, double sum_sq_out, double sum_sq_ref) {
  if (sum_sq_out > 0 && sum_sq_ref > 0) return dot / (std::sqrt(sum_sq_out) * std::sqrt(sum_sq_ref));
  return (sum_sq_out == 0 && sum_sq_ref == 0) ? 1.0 : 0.0;
}

// The errors over the rows that see a key, when some do not.
ErrorStats::Subset compare_rows_with_a_key(const HostTensor& output, const ReferenceOutput& reference) {
  const AttentionShape& s = reference.shape;
  ErrorStats::Subset subset;
  double sum_abs = 0, sum_sq_error = 0, sum_sq_ref = 0, sum_sq_out = 0, dot = 0;
  const std::size_t esize = dtype_size(output.dtype);
  const auto n_rows = reference.rows.size();
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.heads_q; ++h)
      for (std::size_t slot = 0; slot < n_rows; ++slot) {
        if (reference.no_key[static_cast<std::size_t>(b * s.heads_q + h) * n_rows + slot]) continue;
        const std::int64_t base = ((b * s.heads_q + h) * s.seq_q + reference.rows[slot]) * s.head_dim_vo;
        for (std::int64_t d = 0; d < s.head_dim_vo; ++d) {
          const double o = element_to_double(output.dtype, output.data() + static_cast<std::size_t>(base + d) * esize);
          if (std::isnan(o) || std::isinf(o)) {
            ++(std::isnan(o) ? subset.nan_count : subset.inf_count);
            continue;
          }
          const double r = reference.at(b, h, slot, d);
          const double error = std::abs(o - r);
          ++subset.elements;
          subset.max_abs = std::max(subset.max_abs, error);
          sum_abs += error;
          sum_sq_error += error * error;
          sum_sq_ref += r * r;
          sum_sq_out += o * o;
          dot += o * r;
        }
      }
  if (subset.elements > 0) {
    subset.mean_abs = sum_abs / static_cast<double>(subset.elements);
    subset.rel_l2 = relative_l2(sum_sq_error, sum_sq_ref);
    subset.cosine = cosine_of(dot, sum_sq_out, sum_sq_ref);
  }
  return subset;
}

void check_output_shape(const HostTensor& output, const AttentionShape& s) {
  const std::vector<std::int64_t> want{s.batch, s.heads_q, s.seq_q, s.head_dim_vo};
  if (output.shape != want) {
    throw InputError(fmt::format("kernel output is {}, expected {}", shape_string(output.shape), shape_string(want)));
  }
}

}  // namespace

ErrorStats compare_to_reference(const HostTensor& output, const ReferenceOutput& reference) {
  const AttentionShape& s = reference.shape;
  check_output_shape(output, s);
  ErrorStats stats;
  stats.sampled = reference.sampled;
  stats.rows_compared = static_cast<std::int64_t>(reference.rows.size());
  Running out_moments, ref_moments, abs_error;
  double sum_sq_error = 0, sum_abs_ref = 0, sum_sq_ref = 0, sum_sq_out = 0, dot = 0;
  const std::size_t esize = dtype_size(output.dtype);
  const std::byte* data = output.data();
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.heads_q; ++h)
      for (std::size_t slot = 0; slot < reference.rows.size(); ++slot) {
        const std::int64_t row = reference.rows[slot];
        const std::int64_t base = ((b * s.heads_q + h) * s.seq_q + row) * s.head_dim_vo;
        for (std::int64_t d = 0; d < s.head_dim_vo; ++d) {
          const double o = element_to_double(output.dtype, data + static_cast<std::size_t>(base + d) * esize);
          const double r = reference.at(b, h, slot, d);
          if (std::isnan(o)) {
            ++stats.nan_count;
            continue;
          }
          if (std::isinf(o)) {
            ++stats.inf_count;
            continue;
          }
          const double error = std::abs(o - r);
          if (error > stats.max_abs || abs_error.count == 0) {
            stats.max_abs = error;
            stats.worst_batch = b, stats.worst_head = h, stats.worst_row = row, stats.worst_channel = d;
          }
          abs_error.add(error);
          out_moments.add(o);
          ref_moments.add(r);
          sum_sq_error += error * error;
          sum_abs_ref += std::abs(r);
          sum_sq_ref += r * r;
          sum_sq_out += o * o;
          dot += o * r;
        }
      }
  stats.elements = abs_error.count;
  if (stats.elements > 0) {
    const auto n = static_cast<double>(stats.elements);
    stats.mean_abs = abs_error.mean;
    stats.std_abs = abs_error.moments().std;
    stats.mse = sum_sq_error / n;
    stats.rmse = std::sqrt(stats.mse);
    stats.rel_l1 = sum_abs_ref > 0 ? abs_error.mean * n / sum_abs_ref : (abs_error.mean > 0 ? INFINITY : 0.0);
    stats.rel_l2 = relative_l2(sum_sq_error, sum_sq_ref);
    stats.cosine = cosine_of(dot, sum_sq_out, sum_sq_ref);
  }
  stats.output = out_moments.moments();
  stats.reference = ref_moments.moments();
  if (!reference.no_key.empty()) {
    stats.no_key_rows = std::count(reference.no_key.begin(), reference.no_key.end(), std::uint8_t{1});
    stats.rows_with_a_key = compare_rows_with_a_key(output, reference);
  }
  return stats;
}

std::vector<HeadError> compare_per_head(const HostTensor& output, const ReferenceOutput& reference) {
  const AttentionShape& s = reference.shape;
  check_output_shape(output, s);
  std::vector<HeadError> heads;
  heads.reserve(static_cast<std::size_t>(s.batch * s.heads_q));
  const std::size_t esize = dtype_size(output.dtype);
  const std::byte* data = output.data();
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.heads_q; ++h) {
      HeadError head;
      head.batch = b, head.head = h;
      double sum_sq_error = 0, sum_sq_ref = 0, sum_sq_out = 0, dot = 0;
      std::int64_t compared = 0;
      for (std::size_t slot = 0; slot < reference.rows.size(); ++slot) {
        const std::int64_t base = ((b * s.heads_q + h) * s.seq_q + reference.rows[slot]) * s.head_dim_vo;
        for (std::int64_t d = 0; d < s.head_dim_vo; ++d) {
          const double o = element_to_double(output.dtype, data + static_cast<std::size_t>(base + d) * esize);
          if (!std::isfinite(o)) {
            ++head.nonfinite_count;
            continue;
          }
          const double r = reference.at(b, h, slot, d);
          const double error = std::abs(o - r);
          ++compared;
          head.max_abs = std::max(head.max_abs, error);
          sum_sq_error += error * error;
          sum_sq_ref += r * r;
          sum_sq_out += o * o;
          dot += o * r;
        }
      }
      // As compare_to_reference: with nothing finite to compare, the figures stay 0.
      if (compared == 0) {
        heads.push_back(head);
        continue;
      }
      head.rel_l2 = relative_l2(sum_sq_error, sum_sq_ref);
      head.cosine = cosine_of(dot, sum_sq_out, sum_sq_ref);
      heads.push_back(head);
    }
  return heads;
}

}  // namespace attnreplay
