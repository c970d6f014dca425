#include "replay/judge/compare.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <optional>
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

// Computed in fp64 where the reference is, in one pass over both tensors (error_sums): on the GPU a
// call's output is compared where the reference already is. Figures are as the docs define them
// (docs/metrics.md); the pass's summation order is fixed, and agrees with a serial sum to fp64
// rounding.
ErrorStats compare_to_reference(const HostTensor& output, const ReferenceOutput& reference) {
  check_output_shape(output.shape, reference.shape);
  at::InferenceMode inference;
  return compare_to_reference(torch_view_of_host_tensor(output), reference);
}

namespace {

// The largest error's place, from its index among the compared (b, h, row slot, channel) elements.
void place_worst(ErrorFigures& figures, std::int64_t flat, const ReferenceOutput& reference) {
  const AttentionShape& s = reference.shape;
  const auto n_rows = static_cast<std::int64_t>(reference.rows.size());
  figures.worst_channel = flat % s.head_dim_vo;
  const std::int64_t slot = flat / s.head_dim_vo % n_rows;
  figures.worst_row = reference.rows[static_cast<std::size_t>(slot)];
  figures.worst_head = flat / s.head_dim_vo / n_rows % s.heads_q;
  figures.worst_batch = flat / s.head_dim_vo / n_rows / s.heads_q;
}

// The figures from the pass's sums (docs/metrics.md). Where the reference is not finite (inputs
// holding NaN) every error figure is NaN and the worst element is the first such place: no figure
// may read as a small error.
ErrorFigures figures_from_sums(const ErrorSums& sums, const ReferenceOutput& reference) {
  ErrorFigures figures;
  figures.nan_count = sums.nan, figures.inf_count = sums.inf;
  figures.elements = sums.finite;
  if (sums.reference_nonfinite > 0) {
    figures.max_abs = figures.mean_abs = figures.mse = figures.rmse = figures.std_abs = NAN;
    figures.rel_l1 = figures.rel_l2 = figures.cosine = figures.max_rel = NAN;
    if (sums.finite > 0) {
      figures.output = {sums.o_min, sums.o_max, sums.o_mean, std::sqrt(sums.o_m2 / static_cast<double>(sums.finite))};
    }
    figures.reference = {NAN, NAN, NAN, NAN};
    place_worst(figures, sums.first_reference_nonfinite, reference);
  } else if (sums.finite > 0) {
    const auto n = static_cast<double>(sums.finite);
    figures.max_abs = sums.max_abs, figures.mean_abs = sums.e_mean, figures.mse = sums.sum_e2 / n;
    figures.std_abs = std::sqrt(sums.e_m2 / n);
    figures.rmse = std::sqrt(figures.mse);
    figures.rel_l1 = ratio_of(sums.e_mean * n, sums.sum_abs_r);
    figures.rel_l2 = relative_l2(sums.sum_e2, sums.sum_r2);
    figures.cosine = cosine_of(sums.sum_or, sums.sum_o2, sums.sum_r2);
    figures.output = {sums.o_min, sums.o_max, sums.o_mean, std::sqrt(sums.o_m2 / n)};
    figures.reference = {sums.r_min, sums.r_max, sums.r_mean, std::sqrt(sums.r_m2 / n)};
    place_worst(figures, sums.worst_index, reference);
    figures.max_rel = sums.max_rel;
    figures.beyond_tolerance = sums.beyond_tolerance;
  }
  return figures;
}

// The dtypes the pass reads as they are; nullopt for the others.
std::optional<ErrorSumsDType> pass_dtype(at::ScalarType type) {
  switch (type) {
    case at::kDouble: return ErrorSumsDType::float64;
    case at::kFloat: return ErrorSumsDType::float32;
    case at::kHalf: return ErrorSumsDType::float16;
    case at::kBFloat16: return ErrorSumsDType::bfloat16;
    default: return std::nullopt;
  }
}

// The pass on the host: fixed chunks folded on every core, merged in their order, so that the sums
// do not depend on how many threads ran. Rows `skip_rows` marks are left out.
template <class T>
void fold_on_host(const T* out, const double* ref, const std::uint8_t* skip_rows, std::int64_t row_width,
                  std::int64_t elements, ErrorSums& sums) {
  constexpr std::int64_t kChunk = 1 << 15;
  const std::int64_t chunks = (elements + kChunk - 1) / kChunk;
  std::vector<ErrorSums> partial(static_cast<std::size_t>(chunks));
  at::parallel_for(0, chunks, 1, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t c = first; c < last; ++c) {
      ErrorSums& s = partial[static_cast<std::size_t>(c)];
      for (std::int64_t i = c * kChunk; i < std::min(elements, (c + 1) * kChunk); ++i) {
        if (skip_rows != nullptr && skip_rows[i / row_width] != 0) continue;
        fold(s, static_cast<double>(out[i]), ref[i], i, kRelativeEpsilon, kTolerance);
      }
    }
  });
  for (const ErrorSums& s : partial) merge(sums, s);
}

ErrorSums host_error_sums(const at::Tensor& o, const at::Tensor& r, const ReferenceOutput& reference,
                          bool only_rows_with_a_key) {
  ErrorSums sums;
  const std::uint8_t* skip = only_rows_with_a_key ? reference.no_key.data() : nullptr;
  const std::int64_t width = reference.shape.head_dim_vo, n = o.numel();
  const double* ref = r.data_ptr<double>();
  switch (*pass_dtype(o.scalar_type())) {
    case ErrorSumsDType::float64: fold_on_host(o.data_ptr<double>(), ref, skip, width, n, sums); break;
    case ErrorSumsDType::float32: fold_on_host(o.data_ptr<float>(), ref, skip, width, n, sums); break;
    case ErrorSumsDType::float16: fold_on_host(o.data_ptr<at::Half>(), ref, skip, width, n, sums); break;
    case ErrorSumsDType::bfloat16: fold_on_host(o.data_ptr<at::BFloat16>(), ref, skip, width, n, sums); break;
  }
  return sums;
}

#ifdef ATTNREPLAY_FUSED_COMPARE
ErrorSums gpu_error_sums(const at::Tensor& o, const at::Tensor& r, const ReferenceOutput& reference,
                         bool only_rows_with_a_key) {
  // The marks of rows without a key: on the GPU already beside a GPU reference's values.
  at::Tensor skip;
  if (only_rows_with_a_key) {
    skip = reference.device_no_key ? *reference.device_no_key
                                   : at::from_blob(const_cast<std::uint8_t*>(reference.no_key.data()),
                                                   {static_cast<std::int64_t>(reference.no_key.size())},
                                                   at::TensorOptions().dtype(at::kByte))
                                         .to(r.device());
  }
  const at::Tensor workspace =
      at::empty({static_cast<std::int64_t>(error_sums_workspace_bytes())}, r.options().dtype(at::kByte));
  ErrorSumsProblem problem;
  problem.output = o.data_ptr();
  problem.output_dtype = *pass_dtype(o.scalar_type());
  problem.reference = r.data_ptr<double>();
  problem.elements = o.numel();
  problem.row_width = reference.shape.head_dim_vo;
  problem.skip_rows = skip.defined() ? skip.data_ptr<std::uint8_t>() : nullptr;
  ErrorSums sums;
  if (const char* error = error_sums_on_gpu(problem, kRelativeEpsilon, kTolerance, workspace.data_ptr(),
                                            c10::cuda::getCurrentCUDAStream().stream(), sums)) {
    throw std::runtime_error(std::string("comparing with the reference on the GPU: ") + error);
  }
  return sums;
}
#endif

// The pass where the reference is: on the GPU (replay/judge/cuda/error_sums.cu), or on the host's
// cores, where a build without the GPU pass also brings a GPU reference. With
// `only_rows_with_a_key`, the rows ReferenceOutput::no_key marks are left out.
ErrorSums error_sums(const at::Tensor& o, const at::Tensor& r, const ReferenceOutput& reference,
                     bool only_rows_with_a_key) {
#ifdef ATTNREPLAY_FUSED_COMPARE
  if (r.is_cuda()) return gpu_error_sums(o, r, reference, only_rows_with_a_key);
#endif
  return host_error_sums(o.cpu(), r.cpu(), reference, only_rows_with_a_key);
}

}  // namespace

ErrorStats compare_to_reference(const at::Tensor& output, const ReferenceOutput& reference) {
  check_output_shape(output.sizes().vec(), reference.shape);
  at::InferenceMode inference;
  ErrorStats stats;
  stats.sampled = reference.sampled;
  stats.rows_compared = static_cast<std::int64_t>(reference.rows.size());
  const at::Tensor r = reference_tensor(reference).contiguous();
  // Moved in its own dtype to where the reference is; widened there only where the pass does not
  // read that dtype.
  at::Tensor o = output.to(r.device());
  if (reference.sampled) {
    o = o.index_select(2, at::tensor(reference.rows, at::TensorOptions().dtype(at::kLong)).to(r.device()));
  }
  if (!pass_dtype(o.scalar_type())) o = o.to(at::kDouble);
  o = o.contiguous();
  const ErrorFigures every_row = figures_from_sums(error_sums(o, r, reference, false), reference);
  if (reference.no_key.empty()) {
    static_cast<ErrorFigures&>(stats) = every_row;
    return stats;
  }
  // A second pass, over the rows that see a key: the figures a kernel is judged by.
  static_cast<ErrorFigures&>(stats) = figures_from_sums(error_sums(o, r, reference, true), reference);
  stats.no_key_rows = std::count(reference.no_key.begin(), reference.no_key.end(), std::uint8_t{1});
  stats.including_rows_without_a_key = every_row;
  return stats;
}

// Each (batch, head) folded as the whole call is (error_fold.h), over its rows that see a key, and
// its figures read from the sums as figures_from_sums reads them: a reference that is not finite
// makes every figure NaN, never a small error; with nothing finite to compare they stay 0.
std::vector<HeadError> compare_per_head(const HostTensor& output, const ReferenceOutput& reference) {
  const AttentionShape& s = reference.shape;
  check_output_shape(output.shape, s);
  std::vector<HeadError> heads;
  heads.reserve(static_cast<std::size_t>(s.batch * s.heads_q));
  const std::size_t esize = dtype_size(output.dtype);
  const std::byte* data = output.data();
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.heads_q; ++h) {
      ErrorSums sums;
      std::int64_t index = 0;
      const std::size_t first_slot = static_cast<std::size_t>(b * s.heads_q + h) * reference.rows.size();
      for (std::size_t slot = 0; slot < reference.rows.size(); ++slot) {
        if (!reference.no_key.empty() && reference.no_key[first_slot + slot]) {
          index += s.head_dim_vo;
          continue;
        }
        const std::int64_t base = ((b * s.heads_q + h) * s.seq_q + reference.rows[slot]) * s.head_dim_vo;
        for (std::int64_t d = 0; d < s.head_dim_vo; ++d) {
          const double o = element_to_double(output.dtype, data + static_cast<std::size_t>(base + d) * esize);
          fold(sums, o, reference.at(b, h, slot, d), index++, kRelativeEpsilon, kTolerance);
        }
      }
      HeadError& head = heads.emplace_back();
      head.batch = b, head.head = h;
      head.nonfinite_count = sums.nan + sums.inf;
      if (sums.reference_nonfinite > 0) {
        head.rel_l2 = head.cosine = head.max_abs = NAN;
      } else if (sums.finite > 0) {
        head.max_abs = sums.max_abs;
        head.rel_l2 = relative_l2(sums.sum_e2, sums.sum_r2);
        head.cosine = cosine_of(sums.sum_or, sums.sum_o2, sums.sum_r2);
      }
    }
  return heads;
}

}  // namespace attnreplay
