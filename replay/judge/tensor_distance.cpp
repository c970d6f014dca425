#include "replay/judge/tensor_distance.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "formats/errors.h"

namespace attnreplay {

TensorDistance tensor_distance(const HostTensor& value, const HostTensor& reference, const std::string& what) {
  if (value.shape != reference.shape) {
    throw InputError(fmt::format("{}: shape {} against {}", what, shape_string(value.shape), shape_string(reference.shape)));
  }
  const std::vector<double> v = value.to_doubles(), r = reference.to_doubles();
  TensorDistance d;
  d.elements = static_cast<std::int64_t>(r.size());
  double diff2 = 0, ref2 = 0, val2 = 0, dot = 0, peak = 0;
  std::int64_t compared = 0;
  for (std::size_t i = 0; i < r.size(); ++i) {
    if (v[i] != r[i] && !(std::isnan(v[i]) && std::isnan(r[i]))) {
      ++d.differing;
      if (!d.first_difference) {
        std::vector<std::int64_t> index(value.shape.size());
        std::int64_t rest = static_cast<std::int64_t>(i);
        for (std::size_t dim = index.size(); dim-- > 0;) {
          index[dim] = rest % value.shape[dim];
          rest /= value.shape[dim];
        }
        d.first_difference = std::move(index);
      }
    }
    if (!std::isfinite(r[i])) continue;
    if (!std::isfinite(v[i])) {
      ++d.nonfinite;
      continue;
    }
    const double e = v[i] - r[i];
    d.max_abs = std::max(d.max_abs, std::abs(e));
    diff2 += e * e;
    ref2 += r[i] * r[i];
    val2 += v[i] * v[i];
    dot += v[i] * r[i];
    peak = std::max(peak, std::abs(r[i]));
    ++compared;
  }
  d.rel_l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : (diff2 > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  d.cosine = val2 > 0 && ref2 > 0 ? dot / std::sqrt(val2 * ref2) : (val2 == ref2 ? 1.0 : 0.0);
  const double mse = compared > 0 ? diff2 / static_cast<double>(compared) : 0.0;
  d.psnr_db = mse > 0 ? 20 * std::log10(peak / std::sqrt(mse)) : std::numeric_limits<double>::infinity();
  return d;
}

std::optional<double> image_ssim(const HostTensor& value, const HostTensor& reference) {
  if (value.shape != reference.shape || value.dtype != DType::uint8 || reference.dtype != DType::uint8) return std::nullopt;
  const auto& shape = value.shape;
  std::int64_t images = 1, height = 0, width = 0, channels = 1;
  if (shape.size() == 2) {
    height = shape[0], width = shape[1];
  } else if (shape.size() == 3 && shape[2] <= 4) {
    height = shape[0], width = shape[1], channels = shape[2];
  } else if (shape.size() == 4 && shape[3] <= 4) {
    images = shape[0], height = shape[1], width = shape[2], channels = shape[3];
  } else {
    return std::nullopt;
  }
  constexpr int kWindow = 11;
  if (height < kWindow || width < kWindow) return std::nullopt;
  double weights[kWindow], total = 0;
  for (int i = 0; i < kWindow; ++i) total += weights[i] = std::exp(-0.5 * std::pow((i - kWindow / 2) / 1.5, 2));
  for (double& w : weights) w /= total;
  const double c1 = std::pow(0.01 * 255, 2), c2 = std::pow(0.03 * 255, 2);
  const std::vector<double> x = value.to_doubles(), y = reference.to_doubles();
  double sum = 0;
  std::int64_t windows = 0;
  for (std::int64_t n = 0; n < images; ++n) {
    for (std::int64_t c = 0; c < channels; ++c) {
      auto at = [&](const std::vector<double>& image, std::int64_t row, std::int64_t col) {
        return image[static_cast<std::size_t>(((n * height + row) * width + col) * channels + c)];
      };
      // Every window that fits (no padding), as scikit-image and the paper's reference code do.
      for (std::int64_t top = 0; top + kWindow <= height; ++top) {
        for (std::int64_t left = 0; left + kWindow <= width; ++left) {
          double mx = 0, my = 0, xx = 0, yy = 0, xy = 0;
          for (int i = 0; i < kWindow; ++i) {
            for (int j = 0; j < kWindow; ++j) {
              const double w = weights[i] * weights[j];
              const double a = at(x, top + i, left + j), b = at(y, top + i, left + j);
              mx += w * a, my += w * b, xx += w * a * a, yy += w * b * b, xy += w * a * b;
            }
          }
          const double vx = xx - mx * mx, vy = yy - my * my, cov = xy - mx * my;
          sum += (2 * mx * my + c1) * (2 * cov + c2) / ((mx * mx + my * my + c1) * (vx + vy + c2));
          ++windows;
        }
      }
    }
  }
  return sum / static_cast<double>(windows);
}

LogitAgreement logit_agreement(const HostTensor& value, const HostTensor& reference) {
  LogitAgreement agreement;
  if (value.shape != reference.shape || value.rank() == 0 || value.shape.back() < 2) return agreement;
  const std::vector<double> v = value.to_doubles(), r = reference.to_doubles();
  const std::size_t width = static_cast<std::size_t>(value.shape.back());
  const std::size_t rows = v.size() / width;
  double kl_sum = 0;
  std::int64_t agree = 0;
  auto log_softmax = [width](const double* x, std::vector<double>& out) {
    const double top = *std::max_element(x, x + width);
    double sum = 0;
    for (std::size_t j = 0; j < width; ++j) sum += std::exp(x[j] - top);
    const double log_sum = top + std::log(sum);
    for (std::size_t j = 0; j < width; ++j) out[j] = x[j] - log_sum;
  };
  std::vector<double> lv(width), lr(width);
  for (std::size_t row = 0; row < rows; ++row) {
    const double* x = v.data() + row * width;
    const double* y = r.data() + row * width;
    agree += std::max_element(x, x + width) - x == std::max_element(y, y + width) - y;
    log_softmax(x, lv);
    log_softmax(y, lr);
    double kl = 0;
    for (std::size_t j = 0; j < width; ++j) kl += std::exp(lr[j]) * (lr[j] - lv[j]);
    kl_sum += kl;
  }
  agreement.rows = static_cast<std::int64_t>(rows);
  agreement.top1 = rows ? static_cast<double>(agree) / static_cast<double>(rows) : 0.0;
  agreement.mean_kl = rows ? kl_sum / static_cast<double>(rows) : 0.0;
  return agreement;
}

}  // namespace attnreplay
