#include "replay/judge/compare.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "formats/errors.h"
#include "formats/torch_tensor.h"
#include "replay/judge/error_fold.h"

#ifdef ATTNREPLAY_FUSED_COMPARE
#include <c10/cuda/CUDAStream.h>

#include "replay/judge/cuda/error_sums.h"
#endif

namespace attnreplay {
namespace {

// FlashInfer-Bench's relative error and default tolerance (its bench/utils.py and BenchmarkConfig).
constexpr double kRelativeEpsilon = 1e-8;
constexpr double kTolerance = 1e-2;

// error / reference: infinite over a zero reference, and NaN where a sum is (a reference computed
// from inputs holding NaN), never a 0 that reads as no error.
double ratio_of(double error, double reference) {
  if (std::isnan(error) || std::isnan(reference)) return NAN;
  return reference > 0 ? error / reference : (error > 0 ? INFINITY : 0.0);
}

double relative_l2(double sum_sq_error, double sum_sq_ref) { return std::sqrt(ratio_of(sum_sq_error, sum_sq_ref)); }

// 1 when both are zero: nothing to tell apart; NaN where a sum is.
double cosine_of(double dot, double sum_sq_out, double sum_sq_ref) {
  if (std::isnan(dot) || std::isnan(sum_sq_out) || std::isnan(sum_sq_ref)) return NAN;
  if (sum_sq_out > 0 && sum_sq_ref > 0) return dot / (std::sqrt(sum_sq_out) * std::sqrt(sum_sq_ref));
  return (sum_sq_out == 0 && sum_sq_ref == 0) ? 1.0 : 0.0;
}

void check_output_shape(const std::vector<std::int64_t>& shape, const AttentionShape& s) {
  const std::vector<std::int64_t> want{s.batch, s.heads_q, s.seq_q, s.head_dim_vo};
  if (shape != want) {
    throw InputError(fmt::format("kernel output is {}, expected {}", shape_string(shape), shape_string(want)));
  }
}

}  // namespace

namespace {

// The reference where it lives: on the GPU when it was computed there, else over the host values
// (no copy). (b, h_q, rows, d_vo) fp64.
at::Tensor reference_tensor(const ReferenceOutput& reference) {
  if (reference.device_values) return *reference.device_values;
  const AttentionShape& s = reference.shape;
  return at::from_blob(const_cast<double*>(reference.values.data()),
                       {s.batch, s.heads_q, static_cast<std::int64_t>(reference.rows.size()), s.head_dim_vo},
                       at::TensorOptions().dtype(at::kDouble));
}

}  // namespace

// Computed in fp64 on the device the reference is on, in one pass over both tensors
// (compare_in_one_pass): on the GPU a call's output is compared where the reference already is.
// Figures are as the docs define them (docs/metrics.md); the summation order is the pass's or the
// library's, so they agree with a serial sum to fp64 rounding.
ErrorStats compare_to_reference(const HostTensor& output, const ReferenceOutput& reference) {
  check_output_shape(output.shape, reference.shape);
  at::InferenceMode inference;
  return compare_to_reference(torch_view_of_host_tensor(output), reference);
}

namespace {

// The largest error's place, from its index among the compared (b, h, row slot, channel) elements.
void place_worst(ErrorStats& stats, std::int64_t flat, const ReferenceOutput& reference) {
  const AttentionShape& s = reference.shape;
  const auto n_rows = static_cast<std::int64_t>(reference.rows.size());
  stats.worst_channel = flat % s.head_dim_vo;
  const std::int64_t slot = flat / s.head_dim_vo % n_rows;
  stats.worst_row = reference.rows[static_cast<std::size_t>(slot)];
  stats.worst_head = flat / s.head_dim_vo / n_rows % s.heads_q;
  stats.worst_batch = flat / s.head_dim_vo / n_rows / s.heads_q;
}

// The figures over the finite outputs `of` (with `e` their |o - r|, `error` the whole |o - r| with
// -1 where the output is not finite), read back from the device together.
void fill_figures(ErrorStats& stats, const at::Tensor& error, const at::Tensor& e, const at::Tensor& of,
                  const at::Tensor& rf, const ReferenceOutput& reference) {
  // Each figure in one pass where torch has one (std_mean, aminmax, dot), read back together.
  const auto [e_std, e_mean] = at::std_mean(e, /*unbiased=*/false);
  const auto [o_std, o_mean] = at::std_mean(of, false);
  const auto [r_std, r_mean] = at::std_mean(rf, false);
  const auto [o_min, o_max] = at::aminmax(of);
  const auto [r_min, r_max] = at::aminmax(rf);
  // The first largest error in (batch, head, row, channel) order.
  const at::Tensor worst = error.reshape(-1).argmax();
  const at::Tensor e_sq = at::dot(e, e);
  const at::Tensor relative = e / (rf.abs() + kRelativeEpsilon);
  const at::Tensor sums = at::stack({error.reshape(-1).index_select(0, worst.reshape(1)).squeeze(0), e_mean,
                                     e_sq / static_cast<double>(stats.elements), e_std, e.sum(),
                                     at::linalg_vector_norm(rf, 1), e_sq, at::dot(rf, rf), at::dot(of, of),
                                     at::dot(of, rf), o_min, o_max, o_mean, o_std, r_min, r_max, r_mean, r_std,
                                     worst.to(at::kDouble), relative.max(),
                                     e.gt(kTolerance).logical_and_(relative.gt(kTolerance)).sum().to(at::kDouble)})
                              .cpu();
  const double* v = sums.data_ptr<double>();
  stats.max_abs = v[0], stats.mean_abs = v[1], stats.mse = v[2], stats.std_abs = v[3];
  stats.rmse = std::sqrt(stats.mse);
  stats.rel_l1 = ratio_of(v[4], v[5]);
  stats.rel_l2 = relative_l2(v[6], v[7]);
  stats.cosine = cosine_of(v[9], v[8], v[7]);
  stats.output = {v[10], v[11], v[12], v[13]};
  stats.reference = {v[14], v[15], v[16], v[17]};
  place_worst(stats, static_cast<std::int64_t>(v[18]), reference);
  stats.max_rel = v[19];
  stats.beyond_tolerance = static_cast<std::int64_t>(v[20]);
}

// The figures again over the rows that see a key (ReferenceOutput::no_key).
ErrorStats::Subset rows_with_a_key(const at::Tensor& o, const at::Tensor& r, const at::Tensor& finite, bool all_finite,
                                   const ReferenceOutput& reference) {
  const AttentionShape& s = reference.shape;
  const at::Tensor sees = at::from_blob(const_cast<std::uint8_t*>(reference.no_key.data()),
                                        {s.batch, s.heads_q, static_cast<std::int64_t>(reference.rows.size()), 1},
                                        at::TensorOptions().dtype(at::kByte))
                              .to(r.device())
                              .eq(0)
                              .expand_as(o);
  const at::Tensor kept = all_finite ? sees : sees.logical_and(finite);
  const at::Tensor ok = o.masked_select(kept), rk = r.masked_select(kept);
  ErrorStats::Subset subset;
  if (!all_finite) {
    const at::Tensor seen_counts =
        at::stack({sees.logical_and(at::isnan(o)).sum(), sees.logical_and(at::isinf(o)).sum()}).cpu();
    subset.nan_count = seen_counts[0].item<std::int64_t>();
    subset.inf_count = seen_counts[1].item<std::int64_t>();
  }
  subset.elements = ok.numel();
  if (subset.elements > 0) {
    const at::Tensor e = (ok - rk).abs_();
    const at::Tensor sums =
        at::stack({e.max(), e.mean(), e.square().sum(), rk.square().sum(), ok.square().sum(), (ok * rk).sum()}).cpu();
    const double* v = sums.data_ptr<double>();
    subset.max_abs = v[0], subset.mean_abs = v[1];
    subset.rel_l2 = relative_l2(v[2], v[3]);
    subset.cosine = cosine_of(v[5], v[4], v[3]);
  }
  return subset;
}

// The figures from one pass's sums, with the same definitions as fill_figures and rows_with_a_key.
void fill_from_sums(ErrorStats& stats, const ErrorSums& sums, const ReferenceOutput& reference) {
  stats.nan_count = sums.nan, stats.inf_count = sums.inf;
  stats.elements = sums.finite;
  if (sums.finite > 0) {
    const auto n = static_cast<double>(sums.finite);
    stats.max_abs = sums.max_abs, stats.mean_abs = sums.e_mean, stats.mse = sums.sum_e2 / n;
    stats.std_abs = std::sqrt(sums.e_m2 / n);
    stats.rmse = std::sqrt(stats.mse);
    stats.rel_l1 = ratio_of(sums.e_mean * n, sums.sum_abs_r);
    stats.rel_l2 = relative_l2(sums.sum_e2, sums.sum_r2);
    stats.cosine = cosine_of(sums.sum_or, sums.sum_o2, sums.sum_r2);
    stats.output = {sums.o_min, sums.o_max, sums.o_mean, std::sqrt(sums.o_m2 / n)};
    stats.reference = {sums.r_min, sums.r_max, sums.r_mean, std::sqrt(sums.r_m2 / n)};
    place_worst(stats, sums.worst_index, reference);
    stats.max_rel = sums.max_rel;
    stats.beyond_tolerance = sums.beyond_tolerance;
  }
  if (!reference.no_key.empty()) {
    stats.no_key_rows = std::count(reference.no_key.begin(), reference.no_key.end(), std::uint8_t{1});
    ErrorStats::Subset subset;
    subset.elements = sums.seen_finite, subset.nan_count = sums.seen_nan, subset.inf_count = sums.seen_inf;
    if (subset.elements > 0) {
      subset.max_abs = sums.seen_max_abs;
      subset.mean_abs = sums.seen_sum_e / static_cast<double>(subset.elements);
      subset.rel_l2 = relative_l2(sums.seen_sum_e2, sums.seen_sum_r2);
      subset.cosine = cosine_of(sums.seen_sum_or, sums.seen_sum_o2, sums.seen_sum_r2);
    }
    stats.rows_with_a_key = subset;
  }
}

bool one_pass_reads(at::ScalarType type) {
  return type == at::kDouble || type == at::kFloat || type == at::kHalf || type == at::kBFloat16;
}

// The pass on the host: fixed chunks folded on every core, merged in their order, so that the sums
// do not depend on how many threads ran.
template <class T>
void fold_on_host(const T* out, const double* ref, const std::uint8_t* no_key, std::int64_t row_width,
                  std::int64_t elements, ErrorSums& sums) {
  constexpr std::int64_t kChunk = 1 << 15;
  const std::int64_t chunks = (elements + kChunk - 1) / kChunk;
  std::vector<ErrorSums> partial(static_cast<std::size_t>(chunks));
  at::parallel_for(0, chunks, 1, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t c = first; c < last; ++c) {
      ErrorSums& s = partial[static_cast<std::size_t>(c)];
      for (std::int64_t i = c * kChunk; i < std::min(elements, (c + 1) * kChunk); ++i) {
        const bool seen = no_key != nullptr && no_key[i / row_width] == 0;
        fold(s, static_cast<double>(out[i]), ref[i], i, seen, kRelativeEpsilon, kTolerance);
      }
    }
  });
  for (const ErrorSums& s : partial) merge(sums, s);
}

ErrorSums host_error_sums(const at::Tensor& o, const at::Tensor& r, const ReferenceOutput& reference) {
  ErrorSums sums;
  const std::uint8_t* no_key = reference.no_key.empty() ? nullptr : reference.no_key.data();
  const std::int64_t width = reference.shape.head_dim_vo, n = o.numel();
  const double* ref = r.data_ptr<double>();
  switch (o.scalar_type()) {
    case at::kDouble: fold_on_host(o.data_ptr<double>(), ref, no_key, width, n, sums); break;
    case at::kFloat: fold_on_host(o.data_ptr<float>(), ref, no_key, width, n, sums); break;
    case at::kHalf: fold_on_host(o.data_ptr<at::Half>(), ref, no_key, width, n, sums); break;
    default: fold_on_host(o.data_ptr<at::BFloat16>(), ref, no_key, width, n, sums); break;
  }
  return sums;
}

#ifdef ATTNREPLAY_FUSED_COMPARE
ErrorSums gpu_error_sums(const at::Tensor& o, const at::Tensor& r, const ReferenceOutput& reference) {
  static const std::map<at::ScalarType, ErrorSumsDType> dtypes = {
      {at::kDouble, ErrorSumsDType::float64}, {at::kFloat, ErrorSumsDType::float32},
      {at::kHalf, ErrorSumsDType::float16}, {at::kBFloat16, ErrorSumsDType::bfloat16}};
  at::Tensor no_key;
  if (!reference.no_key.empty()) {
    no_key = at::from_blob(const_cast<std::uint8_t*>(reference.no_key.data()),
                           {static_cast<std::int64_t>(reference.no_key.size())}, at::TensorOptions().dtype(at::kByte))
                 .to(r.device());
  }
  const at::Tensor workspace =
      at::empty({static_cast<std::int64_t>(error_sums_workspace_bytes())}, r.options().dtype(at::kByte));
  ErrorSumsProblem problem;
  problem.output = o.data_ptr();
  problem.output_dtype = dtypes.at(o.scalar_type());
  problem.reference = r.data_ptr<double>();
  problem.elements = o.numel();
  problem.row_width = reference.shape.head_dim_vo;
  problem.no_key = no_key.defined() ? no_key.data_ptr<std::uint8_t>() : nullptr;
  ErrorSums sums;
  if (const char* error = error_sums_on_gpu(problem, kRelativeEpsilon, kTolerance, workspace.data_ptr(),
                                            c10::cuda::getCurrentCUDAStream().stream(), sums)) {
    throw std::runtime_error(std::string("comparing with the reference on the GPU: ") + error);
  }
  return sums;
}
#endif

// The figures in one pass over both tensors where the reference is: on the GPU
// (replay/judge/cuda/error_sums.cu) or on the host's cores, folding as replay/judge/error_fold.h
// says. False where it does not apply (an output dtype it does not read, a GPU reference in a build
// without the GPU pass, a reference that is not finite), for torch's reductions, which propagate
// what is not finite as torch does.
bool compare_in_one_pass(const at::Tensor& o, const at::Tensor& r, const ReferenceOutput& reference, ErrorStats& stats) {
  if (!one_pass_reads(o.scalar_type()) || r.scalar_type() != at::kDouble || !r.is_contiguous() || !o.is_contiguous()) {
    return false;
  }
  ErrorSums sums;
  if (r.is_cuda()) {
#ifdef ATTNREPLAY_FUSED_COMPARE
    sums = gpu_error_sums(o, r, reference);
#else
    return false;
#endif
  } else {
    sums = host_error_sums(o, r, reference);
  }
  if (sums.reference_nonfinite > 0) return false;
  fill_from_sums(stats, sums, reference);
  return true;
}

}  // namespace

ErrorStats compare_to_reference(const at::Tensor& output, const ReferenceOutput& reference) {
  check_output_shape(output.sizes().vec(), reference.shape);
  at::InferenceMode inference;
  ErrorStats stats;
  stats.sampled = reference.sampled;
  stats.rows_compared = static_cast<std::int64_t>(reference.rows.size());
  const at::Tensor r = reference_tensor(reference);
  // Uploaded (or downloaded) in its own dtype, widened where the reference is.
  at::Tensor o = output.to(r.device());
  if (reference.sampled) {
    o = o.index_select(2, at::tensor(reference.rows, at::TensorOptions().dtype(at::kLong)).to(r.device()));
  }
  if (compare_in_one_pass(o.contiguous(), r, reference, stats)) return stats;
  o = o.to(at::kDouble).contiguous();
  // NaN and Inf are told apart only where some output is not finite (one pass when all are).
  const at::Tensor finite = at::isfinite(o);
  const std::int64_t finite_count = finite.sum().item<std::int64_t>();
  const bool all_finite = finite_count == o.numel();
  if (!all_finite) {
    stats.nan_count = at::isnan(o).sum().item<std::int64_t>();
    stats.inf_count = o.numel() - finite_count - stats.nan_count;
  }
  // Over the elements where the output is finite; the whole tensors when all are (no copies).
  const at::Tensor of = all_finite ? o.reshape(-1) : o.masked_select(finite);
  const at::Tensor rf = all_finite ? r.reshape(-1) : r.masked_select(finite);
  stats.elements = of.numel();
  if (stats.elements > 0) {
    // |o - r| in place, -1 where the output is not finite, so that the largest is among the finite.
    const at::Tensor error = (o - r).abs_();
    if (!all_finite) error.masked_fill_(finite.logical_not(), -1.0);
    const at::Tensor e = all_finite ? error.reshape(-1) : error.masked_select(finite);
    fill_figures(stats, error, e, of, rf, reference);
  }
  if (!reference.no_key.empty()) {
    stats.no_key_rows = std::count(reference.no_key.begin(), reference.no_key.end(), std::uint8_t{1});
    stats.rows_with_a_key = rows_with_a_key(o, r, finite, all_finite, reference);
  }
  return stats;
}

std::vector<HeadError> compare_per_head(const HostTensor& output, const ReferenceOutput& reference) {
  const AttentionShape& s = reference.shape;
  check_output_shape(output.shape, s);
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
