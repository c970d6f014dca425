// Distances between two runs' tensors (replay/judge/tensor_distance.cpp) and the reader of the
// files a job saves (formats/tensor_file.cpp), on tensors small enough to work out by hand.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include "formats/errors.h"
#include "formats/tensor_file.h"
#include "replay/judge/tensor_distance.h"

using namespace attnreplay;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;

namespace {

HostTensor tensor(DType dtype, std::vector<std::int64_t> shape, std::vector<double> values) {
  return HostTensor::from_doubles(dtype, std::move(shape), values);
}

// A .npy file as numpy.save writes one (version 1.0, the header padded to 64 bytes).
std::string write_npy(const std::string& name, const std::string& descr, const std::string& shape, const void* data,
                      std::size_t bytes, bool fortran = false) {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
                       ", 'shape': (" + shape + "), }";
  header.resize(63, ' ');
  header += '\n';
  const auto path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const char length[2] = {static_cast<char>(header.size() & 0xff), static_cast<char>(header.size() >> 8)};
  out.write(length, 2);
  out << header;
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  return path;
}

}  // namespace

TEST_CASE("equal tensors are at distance zero, with an infinite PSNR") {
  const HostTensor a = tensor(DType::float32, {2, 2}, {1, -2, 3, 0.5});
  const TensorDistance d = tensor_distance(a, a, "a");
  CHECK(d.elements == 4);
  CHECK(d.differing == 0);
  CHECK(d.rel_l2 == 0);
  CHECK(d.cosine == 1);
  CHECK(std::isinf(d.psnr_db));
  CHECK_FALSE(d.first_difference);
}

TEST_CASE("distance figures are those worked out by hand") {
  // reference (3, 4), value (3, 5): error (0, 1); ||r|| = 5; peak 4; mse 0.5.
  const TensorDistance d = tensor_distance(tensor(DType::float64, {2}, {3, 5}), tensor(DType::float64, {2}, {3, 4}), "x");
  CHECK(d.differing == 1);
  CHECK_THAT(d.max_abs, WithinAbs(1, 1e-15));
  CHECK_THAT(d.rel_l2, WithinRel(0.2, 1e-12));
  CHECK_THAT(d.cosine, WithinRel((9.0 + 20.0) / (std::sqrt(34.0) * 5.0), 1e-12));
  CHECK_THAT(d.psnr_db, WithinRel(20 * std::log10(4 / std::sqrt(0.5)), 1e-12));
  REQUIRE(d.first_difference);
  CHECK(*d.first_difference == std::vector<std::int64_t>{1});
}

TEST_CASE("token sequences: the first divergent token, by index per dim") {
  const HostTensor as_is = tensor(DType::int64, {2, 4}, {5, 6, 7, 8, 1, 2, 3, 4});
  const HostTensor substituted = tensor(DType::int64, {2, 4}, {5, 6, 7, 8, 1, 2, 9, 9});
  const TensorDistance d = tensor_distance(substituted, as_is, "tokens");
  CHECK(d.differing == 2);
  REQUIRE(d.first_difference);
  CHECK(*d.first_difference == std::vector<std::int64_t>{1, 2});
}

TEST_CASE("a NaN in the substituted run is counted, not averaged in") {
  const TensorDistance d = tensor_distance(tensor(DType::float32, {3}, {1, NAN, 2}), tensor(DType::float32, {3}, {1, 1, 2}), "x");
  CHECK(d.nonfinite == 1);
  CHECK(d.rel_l2 == 0);
}

TEST_CASE("tensors of different shapes are refused, naming what was compared") {
  CHECK_THROWS_WITH(tensor_distance(tensor(DType::float32, {2}, {1, 2}), tensor(DType::float32, {1, 2}, {1, 2}), "emb.npy"),
                    ContainsSubstring("emb.npy") && ContainsSubstring("shape"));
}

TEST_CASE("logits: top-1 agreement per row and the KL of the softmaxes") {
  // Row 0: same argmax (index 2), row 1: argmax 0 against 1.
  const HostTensor reference = tensor(DType::float32, {2, 3}, {0, 1, 2, 0, 3, 1});
  const HostTensor value = tensor(DType::float32, {2, 3}, {0, 1, 2, 4, 3, 1});
  const LogitAgreement a = logit_agreement(value, reference);
  CHECK(a.rows == 2);
  CHECK(a.top1 == 0.5);
  // Row 0 contributes 0; row 1's KL(p_ref || p_val), by hand.
  auto softmax = [](std::vector<double> x) {
    double sum = 0;
    for (double& v : x) sum += (v = std::exp(v));
    for (double& v : x) v /= sum;
    return x;
  };
  const auto p = softmax({0, 3, 1}), q = softmax({4, 3, 1});
  double kl = 0;
  for (int i = 0; i < 3; ++i) kl += p[i] * std::log(p[i] / q[i]);
  CHECK_THAT(a.mean_kl, WithinRel(kl / 2, 1e-12));
  CHECK(logit_agreement(reference, reference).mean_kl == 0);
}

TEST_CASE("SSIM of uint8 images: 1 for the same image, the luminance term alone for flat ones") {
  std::vector<double> gradient(16 * 12 * 3);
  for (std::size_t i = 0; i < gradient.size(); ++i) gradient[i] = static_cast<double>((i * 7) % 256);
  const HostTensor image = tensor(DType::uint8, {16, 12, 3}, gradient);
  REQUIRE(image_ssim(image, image));
  CHECK_THAT(*image_ssim(image, image), WithinAbs(1, 1e-12));
  // Flat images of 100 and 120: no variance, so SSIM = (2 * 100 * 120 + C1) / (100^2 + 120^2 + C1).
  const HostTensor a = tensor(DType::uint8, {12, 12}, std::vector<double>(144, 100));
  const HostTensor b = tensor(DType::uint8, {12, 12}, std::vector<double>(144, 120));
  const double c1 = std::pow(0.01 * 255, 2);
  CHECK_THAT(*image_ssim(a, b), WithinRel((2 * 100 * 120 + c1) / (100 * 100 + 120 * 120 + c1), 1e-12));
  // Not images: floats, too small, too many channels.
  CHECK_FALSE(image_ssim(tensor(DType::float32, {12, 12}, std::vector<double>(144, 1)),
                         tensor(DType::float32, {12, 12}, std::vector<double>(144, 1))));
  CHECK_FALSE(image_ssim(tensor(DType::uint8, {8, 8}, std::vector<double>(64, 1)),
                         tensor(DType::uint8, {8, 8}, std::vector<double>(64, 1))));
  CHECK_FALSE(image_ssim(tensor(DType::uint8, {12, 12, 8}, std::vector<double>(1152, 1)),
                         tensor(DType::uint8, {12, 12, 8}, std::vector<double>(1152, 1))));
}

TEST_CASE("read_tensor_file reads a .npy as NumPy wrote it") {
  const float values[6] = {1, 2, 3, 4, 5, 6};
  const auto path = write_npy("attnreplay_test.npy", "<f4", "2, 3", values, sizeof(values));
  const auto tensors = read_tensor_file(path);
  REQUIRE(tensors.size() == 1);
  CHECK(tensors[0].first.empty());
  CHECK(tensors[0].second.dtype == DType::float32);
  CHECK(tensors[0].second.shape == std::vector<std::int64_t>{2, 3});
  CHECK(tensors[0].second.to_doubles() == std::vector<double>{1, 2, 3, 4, 5, 6});
}

TEST_CASE("read_tensor_file names the file and what it cannot read") {
  const float values[2] = {1, 2};
  CHECK_THROWS_WITH(read_tensor_file(write_npy("attnreplay_f.npy", "<f4", "2,", values, sizeof(values), true)),
                    ContainsSubstring("attnreplay_f.npy") && ContainsSubstring("Fortran"));
  CHECK_THROWS_WITH(read_tensor_file(write_npy("attnreplay_c.npy", "<c8", "1,", values, sizeof(values))),
                    ContainsSubstring("'<c8'"));
  CHECK_THROWS_WITH(read_tensor_file(write_npy("attnreplay_short.npy", "<f4", "4,", values, sizeof(values))),
                    ContainsSubstring("attnreplay_short.npy") && ContainsSubstring("needs 16"));
  const auto junk = (std::filesystem::temp_directory_path() / "attnreplay_junk.bin").string();
  std::ofstream(junk) << "not a tensor file";
  CHECK_THROWS_AS(read_tensor_file(junk), InputError);
  CHECK_THROWS_WITH(read_tensor_file(junk), ContainsSubstring("by its content"));
}
