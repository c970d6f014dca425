#pragma once
// How far one tensor is from another of the same shape: a job's saved output with a kernel
// substituted against the same job's output as is (`attnreplay e2e`), or a call's inputs in the
// two runs. Computed in double precision over every element.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "formats/host_tensor.h"

namespace attnreplay {

struct TensorDistance {
  std::int64_t elements = 0;
  std::int64_t differing = 0;   // elements not bit-for-bit equal in value
  std::int64_t nonfinite = 0;   // NaN or Inf in `value` where `reference` is finite
  double max_abs = 0;
  double rel_l2 = 0;            // ||v - r|| / ||r||; 0 when both are zero
  double cosine = 1;            // <v, r> / (||v|| ||r||); 1 when both are zero
  // 20 log10(peak / rmse), peak = max |r|: images' and latents' measure; infinite when equal.
  double psnr_db = 0;
  // The first element that differs, as an index per dim (a token sequence's first divergent token).
  std::optional<std::vector<std::int64_t>> first_difference;
};

// Throws InputError naming `what` when the shapes differ.
TensorDistance tensor_distance(const HostTensor& value, const HostTensor& reference, const std::string& what);

// SSIM (Wang et al. 2004: an 11x11 Gaussian window of sigma 1.5, K1 = 0.01, K2 = 0.03, dynamic range
// 255) of images saved as uint8 arrays, (H, W), (H, W, C) or (N, H, W, C) with C <= 4 and H, W >= 11:
// the mean over windows, channels and images. Nullopt for tensors not so shaped.
std::optional<double> image_ssim(const HostTensor& value, const HostTensor& reference);

// Logits along the last dim: how often the top-1 agrees, and the mean KL(reference || value) of
// their softmaxes (nats), over all rows.
struct LogitAgreement {
  std::int64_t rows = 0;
  double top1 = 0;     // fraction of rows whose argmax agrees
  double mean_kl = 0;
};
LogitAgreement logit_agreement(const HostTensor& value, const HostTensor& reference);

}  // namespace attnreplay
