// Bit-exact element conversions (formats/dtype.cpp): hand-worked rounding cases for every narrow
// format, exhaustive decode/encode round trips, and a cross-check against libtorch's own casts.
#include <ATen/ATen.h>

#include <catch2/catch_test_macros.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "formats/dtype.h"

using namespace attnreplay;

namespace {

float from_bits(std::uint32_t bits) { return std::bit_cast<float>(bits); }
float pow2(int exponent) { return std::ldexp(1.0f, exponent); }

bool bf16_is_nan(std::uint16_t b) { return (b & 0x7F80u) == 0x7F80u && (b & 0x007Fu) != 0; }
bool fp16_is_nan(std::uint16_t b) { return (b & 0x7C00u) == 0x7C00u && (b & 0x03FFu) != 0; }
bool e4m3fn_is_nan(std::uint8_t b) { return (b & 0x7Fu) == 0x7Fu; }
bool e5m2_is_nan(std::uint8_t b) { return (b & 0x7Cu) == 0x7Cu && (b & 0x03u) != 0; }

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

}  // namespace

TEST_CASE("bfloat16 encode: round to nearest even, ties, subnormals, overflow, specials") {
  CHECK(float_to_bfloat16_bits(1.0f) == 0x3F80);
  CHECK(float_to_bfloat16_bits(-2.0f) == 0xC000);
  // Exactly half an ulp above 1.0 (bf16 ulp at 1 is 2^-7): tie, kept at the even 0x3F80.
  CHECK(float_to_bfloat16_bits(from_bits(0x3F808000u)) == 0x3F80);
  // Half an ulp above the odd 0x3F81: tie rounds up to the even 0x3F82.
  CHECK(float_to_bfloat16_bits(from_bits(0x3F818000u)) == 0x3F82);
  // Just above and below a tie go the nearest way.
  CHECK(float_to_bfloat16_bits(from_bits(0x3F808001u)) == 0x3F81);
  CHECK(float_to_bfloat16_bits(from_bits(0x3F807FFFu)) == 0x3F80);
  // Float subnormals: bf16 shares float's exponent, so they round in the same way.
  CHECK(float_to_bfloat16_bits(from_bits(0x00010000u)) == 0x0001);
  CHECK(float_to_bfloat16_bits(from_bits(0x00008000u)) == 0x0000);  // tie to even 0
  CHECK(float_to_bfloat16_bits(from_bits(0x00018000u)) == 0x0002);  // tie to even 2
  CHECK(float_to_bfloat16_bits(from_bits(0x00000001u)) == 0x0000);
  // Overflow: the largest float rounds up into infinity; a tie above bf16's max (odd) too.
  CHECK(float_to_bfloat16_bits(std::numeric_limits<float>::max()) == 0x7F80);
  CHECK(float_to_bfloat16_bits(from_bits(0x7F7F7FFFu)) == 0x7F7F);
  CHECK(float_to_bfloat16_bits(from_bits(0x7F7F8000u)) == 0x7F80);
  CHECK(float_to_bfloat16_bits(kInf) == 0x7F80);
  CHECK(float_to_bfloat16_bits(-kInf) == 0xFF80);
  CHECK(float_to_bfloat16_bits(-0.0f) == 0x8000);
  CHECK(float_to_bfloat16_bits(0.0f) == 0x0000);
  // NaN stays NaN, also one whose payload sits only in the bits that truncation drops (which
  // plain rounding would turn into infinity).
  CHECK(bf16_is_nan(float_to_bfloat16_bits(kNaN)));
  CHECK(bf16_is_nan(float_to_bfloat16_bits(from_bits(0x7F800001u))));
  CHECK(bf16_is_nan(float_to_bfloat16_bits(from_bits(0xFF800001u))));
  CHECK(bf16_is_nan(float_to_bfloat16_bits(from_bits(0x7FFFFFFFu))));
}

TEST_CASE("float16 encode: round to nearest even, subnormals, overflow at 65520, specials") {
  CHECK(float_to_float16_bits(1.0f) == 0x3C00);
  CHECK(float_to_float16_bits(-1.5f) == 0xBE00);
  // 1 + 2^-11 is half an ulp above 1: tie to even (mantissa 0); 1 + 3*2^-11: tie to mantissa 2.
  CHECK(float_to_float16_bits(1.0f + pow2(-11)) == 0x3C00);
  CHECK(float_to_float16_bits(1.0f + 3 * pow2(-11)) == 0x3C02);
  CHECK(float_to_float16_bits(std::nextafter(1.0f + pow2(-11), 2.0f)) == 0x3C01);
  // Largest finite and the overflow threshold: 65504 is odd, so the tie 65520 goes to infinity.
  CHECK(float_to_float16_bits(65504.0f) == 0x7BFF);
  CHECK(float_to_float16_bits(std::nextafter(65520.0f, 0.0f)) == 0x7BFF);
  CHECK(float_to_float16_bits(65520.0f) == 0x7C00);
  CHECK(float_to_float16_bits(-65520.0f) == 0xFC00);
  CHECK(float_to_float16_bits(1e10f) == 0x7C00);
  CHECK(float_to_float16_bits(std::numeric_limits<float>::max()) == 0x7C00);
  // Subnormals are multiples of 2^-24.
  CHECK(float_to_float16_bits(pow2(-24)) == 0x0001);
  CHECK(float_to_float16_bits(pow2(-25)) == 0x0000);       // tie between 0 and 1: even 0
  CHECK(float_to_float16_bits(3 * pow2(-25)) == 0x0002);   // tie between 1 and 2: even 2
  CHECK(float_to_float16_bits(std::nextafter(pow2(-25), 1.0f)) == 0x0001);
  CHECK(float_to_float16_bits(-pow2(-24)) == 0x8001);
  CHECK(float_to_float16_bits(1023 * pow2(-24)) == 0x03FF);  // largest subnormal
  CHECK(float_to_float16_bits(1023.5f * pow2(-24)) == 0x0400);  // tie rounds up into the normals
  CHECK(float_to_float16_bits(pow2(-14)) == 0x0400);  // smallest normal
  CHECK(float_to_float16_bits(1e-10f) == 0x0000);
  CHECK(float_to_float16_bits(-1e-10f) == 0x8000);  // underflow keeps the sign
  CHECK(float_to_float16_bits(-0.0f) == 0x8000);
  CHECK(float_to_float16_bits(kInf) == 0x7C00);
  CHECK(float_to_float16_bits(-kInf) == 0xFC00);
  CHECK(fp16_is_nan(float_to_float16_bits(kNaN)));
  CHECK(fp16_is_nan(float_to_float16_bits(from_bits(0x7F800001u))));
}

TEST_CASE("float8 e4m3fn encode: no infinity, 448 max, above 464 is NaN, subnormals") {
  CHECK(float_to_e4m3fn_bits(1.0f) == 0x38);
  CHECK(float_to_e4m3fn_bits(-1.0f) == 0xB8);
  // Ties: 1 + 1/16 is halfway between 1 (mantissa 0) and 1.125: stays 1.
  CHECK(float_to_e4m3fn_bits(1.0625f) == 0x38);
  // 1 + 3/16 is halfway between 1.125 (odd) and 1.25 (even): goes to 1.25.
  CHECK(float_to_e4m3fn_bits(1.1875f) == 0x3A);
  CHECK(float_to_e4m3fn_bits(448.0f) == 0x7E);
  CHECK(float_to_e4m3fn_bits(-448.0f) == 0xFE);
  // 464 is halfway between 448 (even) and the NaN slot 480: rounds to 448.
  CHECK(float_to_e4m3fn_bits(464.0f) == 0x7E);
  // Anything that would round past 448 is NaN, as is infinity (there is no infinity).
  CHECK(float_to_e4m3fn_bits(std::nextafter(464.0f, 1000.0f)) == 0x7F);
  CHECK(float_to_e4m3fn_bits(-std::nextafter(464.0f, 1000.0f)) == 0xFF);
  CHECK(float_to_e4m3fn_bits(480.0f) == 0x7F);
  CHECK(float_to_e4m3fn_bits(1e6f) == 0x7F);
  CHECK(float_to_e4m3fn_bits(kInf) == 0x7F);
  CHECK(float_to_e4m3fn_bits(-kInf) == 0xFF);
  CHECK(e4m3fn_is_nan(float_to_e4m3fn_bits(kNaN)));
  // Subnormals are multiples of 2^-9.
  CHECK(float_to_e4m3fn_bits(pow2(-9)) == 0x01);
  CHECK(float_to_e4m3fn_bits(pow2(-10)) == 0x00);       // tie to even 0
  CHECK(float_to_e4m3fn_bits(3 * pow2(-10)) == 0x02);   // tie between 1 and 2: 2
  CHECK(float_to_e4m3fn_bits(7 * pow2(-9)) == 0x07);
  CHECK(float_to_e4m3fn_bits(7.5f * pow2(-9)) == 0x08);  // tie rounds into the smallest normal
  CHECK(float_to_e4m3fn_bits(pow2(-6)) == 0x08);
  CHECK(float_to_e4m3fn_bits(-0.0f) == 0x80);
  CHECK(float_to_e4m3fn_bits(0.0f) == 0x00);
  CHECK(e4m3fn_bits_to_float(0x7E) == 448.0f);
  CHECK(e4m3fn_bits_to_float(0x01) == pow2(-9));
  CHECK(std::isnan(e4m3fn_bits_to_float(0x7F)));
  CHECK(std::isnan(e4m3fn_bits_to_float(0xFF)));
  // 0x78..0x7E are ordinary numbers in e4m3fn (in IEEE-style formats they would be infinities).
  CHECK(e4m3fn_bits_to_float(0x78) == 256.0f);
}

TEST_CASE("float8 e5m2 encode: 57344 max, infinity from 61440, subnormals") {
  CHECK(float_to_e5m2_bits(1.0f) == 0x3C);
  CHECK(float_to_e5m2_bits(1.125f) == 0x3C);  // tie between 1 (even) and 1.25
  CHECK(float_to_e5m2_bits(1.375f) == 0x3E);  // tie between 1.25 (odd) and 1.5
  CHECK(float_to_e5m2_bits(57344.0f) == 0x7B);
  CHECK(float_to_e5m2_bits(std::nextafter(61440.0f, 0.0f)) == 0x7B);
  // 61440 is halfway between 57344 (odd mantissa) and 65536: ties to even, which is infinity.
  CHECK(float_to_e5m2_bits(61440.0f) == 0x7C);
  CHECK(float_to_e5m2_bits(-61440.0f) == 0xFC);
  CHECK(float_to_e5m2_bits(kInf) == 0x7C);
  CHECK(float_to_e5m2_bits(-kInf) == 0xFC);
  CHECK(e5m2_is_nan(float_to_e5m2_bits(kNaN)));
  CHECK(float_to_e5m2_bits(pow2(-16)) == 0x01);
  CHECK(float_to_e5m2_bits(pow2(-17)) == 0x00);
  CHECK(float_to_e5m2_bits(3 * pow2(-17)) == 0x02);
  CHECK(float_to_e5m2_bits(-0.0f) == 0x80);
  CHECK(e5m2_bits_to_float(0x7B) == 57344.0f);
  CHECK(e5m2_bits_to_float(0x7C) == kInf);
  CHECK(e5m2_bits_to_float(0xFC) == -kInf);
  CHECK(std::isnan(e5m2_bits_to_float(0x7D)));
}

TEST_CASE("every bfloat16 and float16 bit pattern survives decode then encode") {
  // A decoded value is exact in float, so encoding must give the same bits back; only NaN payloads
  // may change, and NaN must stay NaN.
  int mismatches_bf16 = 0, mismatches_fp16 = 0;
  for (std::uint32_t bits = 0; bits <= 0xFFFFu; ++bits) {
    const auto b = static_cast<std::uint16_t>(bits);
    const std::uint16_t bf = float_to_bfloat16_bits(bfloat16_bits_to_float(b));
    if (bf16_is_nan(b) ? !bf16_is_nan(bf) : bf != b) ++mismatches_bf16;
    const float half = float16_bits_to_float(b);
    const std::uint16_t fp = float_to_float16_bits(half);
    if (fp16_is_nan(b) ? !(fp16_is_nan(fp) && std::isnan(half)) : fp != b) ++mismatches_fp16;
  }
  CHECK(mismatches_bf16 == 0);
  CHECK(mismatches_fp16 == 0);
}

TEST_CASE("every float8 bit pattern survives decode then encode") {
  int mismatches_e4m3 = 0, mismatches_e5m2 = 0;
  for (std::uint32_t bits = 0; bits <= 0xFFu; ++bits) {
    const auto b = static_cast<std::uint8_t>(bits);
    const float e4 = e4m3fn_bits_to_float(b);
    const std::uint8_t e4_back = float_to_e4m3fn_bits(e4);
    if (e4m3fn_is_nan(b) ? !(std::isnan(e4) && e4m3fn_is_nan(e4_back)) : e4_back != b) ++mismatches_e4m3;
    const float e5 = e5m2_bits_to_float(b);
    const std::uint8_t e5_back = float_to_e5m2_bits(e5);
    if (e5m2_is_nan(b) ? !(std::isnan(e5) && e5m2_is_nan(e5_back)) : e5_back != b) ++mismatches_e5m2;
  }
  CHECK(mismatches_e4m3 == 0);
  CHECK(mismatches_e5m2 == 0);
}

TEST_CASE("element_to_double and element_from_double go through the dtype's bits") {
  std::byte buffer[8];
  element_from_double(DType::bfloat16, 1.0 + 1.0 / 256, buffer);  // tie at bf16 precision
  std::uint16_t bits16 = 0;
  std::memcpy(&bits16, buffer, 2);
  CHECK(bits16 == 0x3F80);
  CHECK(element_to_double(DType::bfloat16, buffer) == 1.0);
  element_from_double(DType::float8_e4m3fn, 1000.0, buffer);
  CHECK(std::isnan(element_to_double(DType::float8_e4m3fn, buffer)));
  element_from_double(DType::float16, -65520.0, buffer);
  CHECK(element_to_double(DType::float16, buffer) == -std::numeric_limits<double>::infinity());
  element_from_double(DType::boolean, 0.25, buffer);
  CHECK(element_to_double(DType::boolean, buffer) == 1.0);
  element_from_double(DType::int32, -7.0, buffer);
  CHECK(element_to_double(DType::int32, buffer) == -7.0);
  element_from_double(DType::float64, 0.1, buffer);
  CHECK(element_to_double(DType::float64, buffer) == 0.1);  // no trip through float
}

namespace {

// Our encoder and torch's cast on the same inputs, compared bit for bit (NaN: NaN-ness only, as
// torch's scalar and vectorised paths disagree on NaN payloads among themselves).
template <typename Bits, typename Ours, typename IsNan>
int count_disagreements(const std::vector<float>& inputs, c10::ScalarType type, Ours ours, IsNan is_nan) {
  at::Tensor source = at::from_blob(const_cast<float*>(inputs.data()), {static_cast<std::int64_t>(inputs.size())},
                                    at::TensorOptions().dtype(at::kFloat));
  at::Tensor cast = source.to(type).contiguous();
  REQUIRE(cast.nbytes() == inputs.size() * sizeof(Bits));
  std::vector<Bits> theirs(inputs.size());
  std::memcpy(theirs.data(), cast.data_ptr(), cast.nbytes());
  int disagreements = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Bits mine = ours(inputs[i]);
    const bool same = std::isnan(inputs[i]) || is_nan(theirs[i]) ? (is_nan(mine) && is_nan(theirs[i]))
                                                                    : mine == theirs[i];
    if (!same) {
      if (++disagreements <= 5) {
        UNSCOPED_INFO("input bits 0x" << std::hex << std::bit_cast<std::uint32_t>(inputs[i]) << ": ours 0x"
                                      << +mine << ", torch 0x" << +theirs[i]);
      }
    }
  }
  return disagreements;
}

std::vector<float> cross_check_inputs() {
  std::vector<float> values = {0.0f, -0.0f, 1.0f, -1.0f, kInf, -kInf, kNaN, -kNaN,
                               from_bits(0x7F800001u), std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(),
                               448.0f, 464.0f, std::nextafter(464.0f, 1e9f), 480.0f, 57344.0f, 61440.0f,
                               std::nextafter(61440.0f, 0.0f), 65504.0f, 65520.0f, std::nextafter(65520.0f, 0.0f),
                               from_bits(0x3F808000u), from_bits(0x3F818000u), from_bits(0x7F7F8000u),
                               pow2(-24), pow2(-25), 3 * pow2(-25), pow2(-9), pow2(-10), 3 * pow2(-10),
                               7.5f * pow2(-9), pow2(-16), pow2(-17), 3 * pow2(-17), 1.0625f, 1.1875f, 1.125f,
                               1.375f};
  std::mt19937_64 generator(12345);
  // Any float bit pattern: every exponent, NaNs included.
  for (int i = 0; i < 2000; ++i) values.push_back(from_bits(static_cast<std::uint32_t>(generator())));
  // Magnitudes where the narrow formats are normal, subnormal or overflow, with a random mantissa.
  std::uniform_int_distribution<int> exponent(-30, 20);
  for (int i = 0; i < 3000; ++i) {
    const std::uint32_t mantissa = static_cast<std::uint32_t>(generator()) & 0x7FFFFFu;
    const std::uint32_t sign = static_cast<std::uint32_t>(generator() & 1u) << 31;
    values.push_back(from_bits(sign | (static_cast<std::uint32_t>(exponent(generator) + 127) << 23) | mantissa));
  }
  // Exact ties at each format's precision (low bits cleared, then the half-ulp bit set).
  for (int i = 0; i < 1000; ++i) {
    const std::uint32_t raw = static_cast<std::uint32_t>(generator());
    const std::uint32_t base = (raw & 0x8FFFFFFFu) | 0x38000000u;  // exponents around 1
    values.push_back(from_bits((base & ~0xFFFFu) | 0x8000u));     // bf16 ties
    values.push_back(from_bits((base & ~0x1FFFu) | 0x1000u));     // fp16 ties
    values.push_back(from_bits((base & ~0xFFFFFu) | 0x80000u));   // e4m3 ties
    values.push_back(from_bits((base & ~0x1FFFFFu) | 0x100000u)); // e5m2 ties
  }
  return values;
}

}  // namespace

TEST_CASE("encoders agree with torch's casts bit for bit") {
  const std::vector<float> inputs = cross_check_inputs();
  CHECK(count_disagreements<std::uint16_t>(inputs, at::kBFloat16, float_to_bfloat16_bits, bf16_is_nan) == 0);
  CHECK(count_disagreements<std::uint16_t>(inputs, at::kHalf, float_to_float16_bits, fp16_is_nan) == 0);
  CHECK(count_disagreements<std::uint8_t>(inputs, at::kFloat8_e4m3fn, float_to_e4m3fn_bits, e4m3fn_is_nan) == 0);
  CHECK(count_disagreements<std::uint8_t>(inputs, at::kFloat8_e5m2, float_to_e5m2_bits, e5m2_is_nan) == 0);
}

TEST_CASE("decoders agree with torch's casts for every bit pattern") {
  // Every bf16/fp16 pattern (as int16) and every fp8 pattern, viewed as the dtype, cast to float.
  auto check_all = [](int count, c10::ScalarType raw_type, c10::ScalarType type, auto decode, auto to_bits) {
    at::Tensor raw = at::arange(count, at::TensorOptions().dtype(at::kInt)).to(raw_type);
    at::Tensor decoded = raw.view(type).to(at::kFloat).contiguous();
    const float* theirs = decoded.data_ptr<float>();
    int disagreements = 0;
    for (int i = 0; i < count; ++i) {
      const float mine = decode(to_bits(i));
      const bool same = std::isnan(theirs[i]) ? std::isnan(mine)
                                              : std::bit_cast<std::uint32_t>(mine) == std::bit_cast<std::uint32_t>(theirs[i]);
      if (!same) ++disagreements;
    }
    return disagreements;
  };
  auto u16 = [](int i) { return static_cast<std::uint16_t>(i); };
  auto u8 = [](int i) { return static_cast<std::uint8_t>(i); };
  CHECK(check_all(65536, at::kShort, at::kBFloat16, bfloat16_bits_to_float, u16) == 0);
  CHECK(check_all(65536, at::kShort, at::kHalf, float16_bits_to_float, u16) == 0);
  CHECK(check_all(256, at::kByte, at::kFloat8_e4m3fn, e4m3fn_bits_to_float, u8) == 0);
  CHECK(check_all(256, at::kByte, at::kFloat8_e5m2, e5m2_bits_to_float, u8) == 0);
}

TEST_CASE("parse_dtype takes torch names, the torch. prefix and short aliases") {
  CHECK(parse_dtype("bf16") == DType::bfloat16);
  CHECK(parse_dtype("bfloat16") == DType::bfloat16);
  CHECK(parse_dtype("torch.bfloat16") == DType::bfloat16);
  CHECK(parse_dtype("fp8") == DType::float8_e4m3fn);
  CHECK(parse_dtype("torch.float8_e4m3fn") == DType::float8_e4m3fn);
  CHECK(parse_dtype("float8_e5m2") == DType::float8_e5m2);
  CHECK(parse_dtype("e5m2") == DType::float8_e5m2);
  CHECK(parse_dtype("fp16") == DType::float16);
  CHECK(parse_dtype("half") == DType::float16);
  CHECK(parse_dtype("torch.float32") == DType::float32);
  CHECK(parse_dtype("float") == DType::float32);
  CHECK(parse_dtype("double") == DType::float64);
  CHECK(parse_dtype("torch.bool") == DType::boolean);
  CHECK(parse_dtype("long") == DType::int64);
  // Every canonical name reads back as itself.
  for (DType dtype : kAllDTypes) CHECK(parse_dtype(dtype_name(dtype)) == dtype);
  CHECK_FALSE(parse_dtype("bfloat").has_value());
  CHECK_FALSE(parse_dtype("float128").has_value());
  CHECK_FALSE(parse_dtype("").has_value());
  CHECK_FALSE(parse_dtype("torch.").has_value());
  CHECK_FALSE(parse_dtype("torch.torch.float32").has_value());
  CHECK_FALSE(parse_dtype("complex64").has_value());
}

TEST_CASE("dtype sizes and floating-ness") {
  CHECK(dtype_size(DType::float64) == 8);
  CHECK(dtype_size(DType::bfloat16) == 2);
  CHECK(dtype_size(DType::float8_e5m2) == 1);
  CHECK(dtype_size(DType::boolean) == 1);
  CHECK(dtype_is_floating(DType::float8_e4m3fn));
  CHECK_FALSE(dtype_is_floating(DType::boolean));
  CHECK_FALSE(dtype_is_floating(DType::int64));
}
