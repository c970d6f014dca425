#pragma once
// What the one-pass comparison folds (compare.cpp on the CPU, cuda/error_sums.cu on the GPU): one
// element into a running ErrorSums, and two ErrorSums into one. Plain C++ that nvcc also compiles
// for the device, so that both devices, and the unit tests (tests/unit/test_error_sums.cpp), fold
// alike.
#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define ATTNREPLAY_HOST_DEVICE __host__ __device__
#else
#define ATTNREPLAY_HOST_DEVICE
#endif

namespace attnreplay {

// The output dtypes the pass reads as they are (compare.cpp widens others to fp64 first).
enum class ErrorSumsDType { float64, float32, float16, bfloat16 };

// Sums over the elements where the output is finite (Welford's mean and M2 where a spread is wanted,
// as torch's std_mean keeps them). Merged share by share in a fixed order (a GPU's blocks, the CPU's
// chunks): the same figures for the same inputs on the same device.
struct ErrorSums {
  std::int64_t finite = 0, nan = 0, inf = 0, beyond_tolerance = 0;
  // Reference elements that are not finite (inputs holding NaN): every error figure is then NaN.
  std::int64_t reference_nonfinite = 0, first_reference_nonfinite = -1;
  std::int64_t worst_index = -1;  // the first element of the largest |o - r|
  double max_abs = -1;
  double e_mean = 0, e_m2 = 0, o_mean = 0, o_m2 = 0, r_mean = 0, r_m2 = 0;
  double sum_e2 = 0, sum_abs_r = 0, sum_r2 = 0, sum_o2 = 0, sum_or = 0;
  double o_min = 0, o_max = 0, r_min = 0, r_max = 0, max_rel = 0;
};

// Chan et al.'s merge of two Welford (mean, M2) pairs over na and nb elements.
ATTNREPLAY_HOST_DEVICE inline void merge_moments(double& mean, double& m2, double other_mean, double other_m2, double na,
                                                 double nb) {
  if (nb == 0) return;
  if (na == 0) {
    mean = other_mean, m2 = other_m2;
    return;
  }
  const double n = na + nb;
  const double delta = other_mean - mean;
  mean += delta * (nb / n);
  m2 += other_m2 + delta * delta * (na * nb / n);
}

// `b` folded into `a`; either may be empty. Ties of the largest error keep the lower index, so the
// order of merging does not move the worst element.
ATTNREPLAY_HOST_DEVICE inline void merge(ErrorSums& a, const ErrorSums& b) {
  using std::fmax, std::fmin;
  const double na = static_cast<double>(a.finite), nb = static_cast<double>(b.finite);
  if (b.finite > 0) {
    if (a.finite == 0) {
      a.o_min = b.o_min, a.o_max = b.o_max, a.r_min = b.r_min, a.r_max = b.r_max;
    } else {
      a.o_min = fmin(a.o_min, b.o_min), a.o_max = fmax(a.o_max, b.o_max);
      a.r_min = fmin(a.r_min, b.r_min), a.r_max = fmax(a.r_max, b.r_max);
    }
    if (b.max_abs > a.max_abs || (b.max_abs == a.max_abs && b.worst_index < a.worst_index)) {
      a.max_abs = b.max_abs, a.worst_index = b.worst_index;
    }
    a.max_rel = fmax(a.max_rel, b.max_rel);
  }
  merge_moments(a.e_mean, a.e_m2, b.e_mean, b.e_m2, na, nb);
  merge_moments(a.o_mean, a.o_m2, b.o_mean, b.o_m2, na, nb);
  merge_moments(a.r_mean, a.r_m2, b.r_mean, b.r_m2, na, nb);
  a.finite += b.finite, a.nan += b.nan, a.inf += b.inf, a.beyond_tolerance += b.beyond_tolerance;
  if (b.first_reference_nonfinite >= 0 &&
      (a.first_reference_nonfinite < 0 || b.first_reference_nonfinite < a.first_reference_nonfinite)) {
    a.first_reference_nonfinite = b.first_reference_nonfinite;
  }
  a.reference_nonfinite += b.reference_nonfinite;
  a.sum_e2 += b.sum_e2, a.sum_abs_r += b.sum_abs_r, a.sum_r2 += b.sum_r2, a.sum_o2 += b.sum_o2, a.sum_or += b.sum_or;
}

// Element `i` (output `o`, reference `r`) folded into `s`. A caller folds its elements in ascending
// `i`, so that the first of equal largest errors stays.
ATTNREPLAY_HOST_DEVICE inline void fold(ErrorSums& s, double o, double r, std::int64_t i, double epsilon,
                                        double tolerance) {
  using std::fabs, std::fmax, std::fmin, std::isfinite, std::isnan;
  if (!isfinite(r) && s.reference_nonfinite++ == 0) s.first_reference_nonfinite = i;
  if (!isfinite(o)) {
    const bool is_nan = isnan(o);
    s.nan += is_nan, s.inf += !is_nan;
    return;
  }
  const double e = fabs(o - r);
  if (s.finite == 0) s.o_min = s.o_max = o, s.r_min = s.r_max = r;
  ++s.finite;
  // Welford's update, one reciprocal for the three.
  const double inverse = 1.0 / static_cast<double>(s.finite);
  double delta = e - s.e_mean;
  s.e_mean += delta * inverse;
  s.e_m2 += delta * (e - s.e_mean);
  delta = o - s.o_mean;
  s.o_mean += delta * inverse;
  s.o_m2 += delta * (o - s.o_mean);
  delta = r - s.r_mean;
  s.r_mean += delta * inverse;
  s.r_m2 += delta * (r - s.r_mean);
  if (e > s.max_abs) s.max_abs = e, s.worst_index = i;
  s.sum_e2 += e * e, s.sum_abs_r += fabs(r), s.sum_r2 += r * r, s.sum_o2 += o * o, s.sum_or += o * r;
  s.o_min = fmin(s.o_min, o), s.o_max = fmax(s.o_max, o), s.r_min = fmin(s.r_min, r), s.r_max = fmax(s.r_max, r);
  const double relative = e / (fabs(r) + epsilon);
  s.max_rel = fmax(s.max_rel, relative);
  s.beyond_tolerance += e > tolerance && relative > tolerance;
}

}  // namespace attnreplay
