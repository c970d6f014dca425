#pragma once
// Shared by the format tests: random calls in every dtype and layout, a temporary folder, and
// an exact comparison of two calls (bytes, shapes, strides, flags, metadata).
#include <catch2/catch_test_macros.hpp>

#include <ftw.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "formats/attention_call.h"

namespace attnreplay::test {

// A fresh folder under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    static std::atomic<int> counter{0};
    std::random_device entropy;
    path_ = std::filesystem::temp_directory_path() /
            ("attnreplay-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
             std::to_string(entropy()));
    std::filesystem::create_directories(path_);
  }
  // POSIX nftw rather than std::filesystem::remove_all: the torch 2.11 wheel's libtorch.so exports
  // its own std::filesystem functions, which win symbol resolution, and its remove_all segfaults.
  ~TempDir() {
    nftw(path_.c_str(), [](const char* file, const struct stat*, int, struct FTW*) { return ::remove(file); }, 16,
         FTW_DEPTH | FTW_PHYS);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Random bytes: every bit pattern (NaNs and infinities included) must survive a format exactly.
// Bool tensors hold 0 or 1.
inline HostTensor random_tensor(DType dtype, std::vector<std::int64_t> shape, std::mt19937_64& rng) {
  HostTensor tensor = HostTensor::allocate(dtype, std::move(shape));
  std::byte* data = tensor.mutable_data();
  for (std::size_t i = 0; i < tensor.nbytes(); ++i) {
    data[i] = static_cast<std::byte>(dtype == DType::boolean ? rng() & 1u : rng() & 0xFFu);
  }
  return tensor;
}

enum class MaskKind { none, boolean, floating };

struct CallSpec {
  DType dtype = DType::float32;
  Layout layout = Layout::bhsd;
  MaskKind mask = MaskKind::none;
  bool with_out = false;
  std::optional<double> scale;
  std::int64_t call_index = 0;
  std::uint64_t seed = 1;
};

// GQA (4 query heads over 2 kv heads), s_q != s_kv, d_vo != d_qk, bottom-right causal.
inline AttentionCall random_call(const CallSpec& spec) {
  std::mt19937_64 rng(spec.seed);
  const std::int64_t b = 2, hq = 4, hkv = 2, sq = 3, skv = 5, dqk = 8, dvo = 6;
  auto dims = [&spec](std::int64_t batch, std::int64_t h, std::int64_t s, std::int64_t d) {
    return spec.layout == Layout::bhsd ? std::vector<std::int64_t>{batch, h, s, d}
                                       : std::vector<std::int64_t>{batch, s, h, d};
  };
  AttentionCall call;
  call.call_index = spec.call_index;
  call.op = "aten::scaled_dot_product_attention";
  call.backend = "flash";
  call.layout = spec.layout;
  call.q = random_tensor(spec.dtype, dims(b, hq, sq, dqk), rng);
  call.k = random_tensor(spec.dtype, dims(b, hkv, skv, dqk), rng);
  call.v = random_tensor(spec.dtype, dims(b, hkv, skv, dvo), rng);
  call.q.device = "cuda:0";
  call.k.device = "cuda:1";
  // q as the model's transposed view: memory ordered the other way round from its dims.
  const std::vector<std::int64_t>& shape = call.q.shape;
  call.q.captured_strides = {shape[1] * shape[2] * shape[3], shape[3], shape[1] * shape[3], 1};
  if (spec.mask == MaskKind::boolean) call.mask = random_tensor(DType::boolean, {b, 1, sq, skv}, rng);
  if (spec.mask == MaskKind::floating) call.mask = random_tensor(DType::float32, {sq, skv}, rng);
  if (spec.with_out) call.out = random_tensor(spec.dtype, dims(b, hq, sq, dvo), rng);
  call.scale = spec.scale;
  call.is_causal = true;
  call.causal_alignment = CausalAlignment::bottom_right;
  call.dropout_p = 0.125;
  call.enable_gqa = true;
  call.metadata = {{"model", "llama"}, {"layer", "12"}, {"step", "3"}, {"call_site", "attn.py:88, \"q\""}};
  return call;
}

inline std::vector<std::int64_t> expected_strides(const HostTensor& tensor) {
  return tensor.captured_strides.empty() ? tensor.contiguous_strides() : tensor.captured_strides;
}

inline void check_same_tensor(const HostTensor& got, const HostTensor& want, const std::string& field) {
  INFO("field " << field);
  CHECK(got.dtype == want.dtype);
  CHECK(got.shape == want.shape);
  CHECK(got.captured_strides == expected_strides(want));
  CHECK(got.device == want.device);
  REQUIRE(got.bytes);
  REQUIRE(got.bytes->size() == want.bytes->size());
  const bool same_bytes = *got.bytes == *want.bytes;  // not decomposed: bytes do not print
  CHECK(same_bytes);
}

inline void check_same_optional(const std::optional<HostTensor>& got, const std::optional<HostTensor>& want,
                                const std::string& field) {
  REQUIRE(got.has_value() == want.has_value());
  if (want) check_same_tensor(*got, *want, field);
}

// Everything a format stores; `source` is where it was read from and is not compared.
inline void check_same_call(const AttentionCall& got, const AttentionCall& want) {
  CHECK(got.call_index == want.call_index);
  CHECK(got.op == want.op);
  CHECK(got.backend == want.backend);
  CHECK(got.layout == want.layout);
  check_same_tensor(got.q, want.q, "q");
  check_same_tensor(got.k, want.k, "k");
  check_same_tensor(got.v, want.v, "v");
  check_same_optional(got.mask, want.mask, "mask");
  check_same_optional(got.out, want.out, "out");
  CHECK(got.scale == want.scale);
  CHECK(got.is_causal == want.is_causal);
  CHECK(got.causal_alignment == want.causal_alignment);
  CHECK(got.dropout_p == want.dropout_p);
  CHECK(got.enable_gqa == want.enable_gqa);
  CHECK(got.metadata == want.metadata);
}

inline constexpr DType kFloatingDTypes[] = {DType::float64,       DType::float32,    DType::float16,
                                            DType::bfloat16,      DType::float8_e4m3fn, DType::float8_e5m2};

}  // namespace attnreplay::test
