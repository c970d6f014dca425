#include "formats/dtype.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "formats/errors.h"

namespace attnreplay {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::float64:
    case DType::int64: return 8;
    case DType::float32:
    case DType::int32: return 4;
    case DType::float16:
    case DType::bfloat16: return 2;
    case DType::float8_e4m3fn:
    case DType::float8_e5m2:
    case DType::int8:
    case DType::uint8:
    case DType::boolean: return 1;
  }
  return 0;
}

bool dtype_is_floating(DType dtype) {
  switch (dtype) {
    case DType::float64:
    case DType::float32:
    case DType::float16:
    case DType::bfloat16:
    case DType::float8_e4m3fn:
    case DType::float8_e5m2: return true;
    default: return false;
  }
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::float64: return "float64";
    case DType::float32: return "float32";
    case DType::float16: return "float16";
    case DType::bfloat16: return "bfloat16";
    case DType::float8_e4m3fn: return "float8_e4m3fn";
    case DType::float8_e5m2: return "float8_e5m2";
    case DType::int64: return "int64";
    case DType::int32: return "int32";
    case DType::int8: return "int8";
    case DType::uint8: return "uint8";
    case DType::boolean: return "bool";
  }
  return "?";
}

const std::vector<std::string>& floating_dtype_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (DType dtype : kAllDTypes)
      if (dtype_is_floating(dtype)) out.emplace_back(dtype_name(dtype));
    return out;
  }();
  return names;
}

std::optional<DType> parse_dtype(std::string_view text) {
  if (text.starts_with("torch.")) text.remove_prefix(6);
  for (DType dtype : kAllDTypes) {
    if (text == dtype_name(dtype)) return dtype;
  }
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"double", DType::float64}, {"fp64", DType::float64},   {"float", DType::float32},
      {"fp32", DType::float32},   {"half", DType::float16},   {"fp16", DType::float16},
      {"bf16", DType::bfloat16},  {"fp8", DType::float8_e4m3fn}, {"e4m3", DType::float8_e4m3fn},
      {"fp8_e4m3", DType::float8_e4m3fn}, {"e5m2", DType::float8_e5m2},
      {"fp8_e5m2", DType::float8_e5m2}, {"long", DType::int64}, {"int", DType::int32},
      {"boolean", DType::boolean}};
  for (const Alias& alias : kAliases) {
    if (text == alias.name) return alias.dtype;
  }
  return std::nullopt;
}

namespace {

std::uint32_t float_bits(float value) { return std::bit_cast<std::uint32_t>(value); }
float bits_float(std::uint32_t bits) { return std::bit_cast<float>(bits); }

// Rounds |value| (finite, >= 0) to `mantissa_bits` with round-to-nearest-even, for a format whose
// smallest normal exponent is `min_exponent`. Returns (biased exponent, mantissa) or an exponent
// past `max_biased` on overflow.
struct Rounded {
  int biased_exponent;
  std::uint32_t mantissa;
};
Rounded round_to_minifloat(float magnitude, int mantissa_bits, int bias) {
  const int min_exponent = 1 - bias;
  int exponent = 0;
  std::frexp(magnitude, &exponent);  // magnitude = m * 2^exponent, m in [0.5, 1)
  int unbiased = exponent - 1;
  if (magnitude == 0.0f || unbiased < min_exponent) {
    // Subnormal: multiples of 2^(min_exponent - mantissa_bits). A result of 2^mantissa_bits is
    // the smallest normal, which the bit pattern expresses by itself.
    auto q = static_cast<std::uint32_t>(std::nearbyint(std::ldexp(magnitude, mantissa_bits - min_exponent)));
    return {static_cast<int>(q >> mantissa_bits), q & ((1u << mantissa_bits) - 1u)};
  }
  auto q = static_cast<std::uint32_t>(std::nearbyint(std::ldexp(magnitude, mantissa_bits - unbiased)));
  if (q == (2u << mantissa_bits)) {
    q >>= 1;
    ++unbiased;
  }
  return {unbiased + bias, q - (1u << mantissa_bits)};
}

float decode_minifloat(std::uint32_t bits, int exponent_bits, int mantissa_bits, int bias) {
  const std::uint32_t sign = bits >> (exponent_bits + mantissa_bits);
  const int exponent = static_cast<int>((bits >> mantissa_bits) & ((1u << exponent_bits) - 1u));
  const std::uint32_t mantissa = bits & ((1u << mantissa_bits) - 1u);
  float magnitude = exponent == 0
                        ? std::ldexp(static_cast<float>(mantissa), 1 - bias - mantissa_bits)
                        : std::ldexp(static_cast<float>(mantissa | (1u << mantissa_bits)),
                                     exponent - bias - mantissa_bits);
  return sign ? -magnitude : magnitude;
}

}  // namespace

std::uint16_t float_to_bfloat16_bits(float value) {
  std::uint32_t bits = float_bits(value);
  if (std::isnan(value)) return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

float bfloat16_bits_to_float(std::uint16_t bits) { return bits_float(std::uint32_t{bits} << 16); }

std::uint16_t float_to_float16_bits(float value) {
  const std::uint16_t sign = (float_bits(value) >> 16) & 0x8000u;
  const float magnitude = std::fabs(value);
  if (std::isnan(value)) return sign | 0x7E00u;
  if (std::isinf(value) || magnitude >= 65520.0f) return sign | 0x7C00u;
  Rounded r = round_to_minifloat(magnitude, 10, 15);
  if (r.biased_exponent >= 31) return sign | 0x7C00u;
  return static_cast<std::uint16_t>(sign | (r.biased_exponent << 10) | r.mantissa);
}

float float16_bits_to_float(std::uint16_t bits) {
  if ((bits & 0x7C00u) == 0x7C00u) {
    const float special = (bits & 0x03FFu) ? std::nanf("") : INFINITY;
    return (bits & 0x8000u) ? -special : special;
  }
  return decode_minifloat(bits, 5, 10, 15);
}

std::uint8_t float_to_e4m3fn_bits(float value) {
  const std::uint8_t sign = (float_bits(value) >> 24) & 0x80u;
  const float magnitude = std::fabs(value);
  // No infinity in e4m3fn: NaN for NaN, infinities and anything that rounds past 448.
  if (!(magnitude < 480.0f)) return sign | 0x7Fu;
  Rounded r = round_to_minifloat(magnitude, 3, 7);
  return static_cast<std::uint8_t>(sign | (r.biased_exponent << 3) | r.mantissa);
}

float e4m3fn_bits_to_float(std::uint8_t bits) {
  if ((bits & 0x7Fu) == 0x7Fu) return std::nanf("");
  return decode_minifloat(bits, 4, 3, 7);
}

std::uint8_t float_to_e5m2_bits(float value) {
  const std::uint8_t sign = (float_bits(value) >> 24) & 0x80u;
  const float magnitude = std::fabs(value);
  if (std::isnan(value)) return sign | 0x7Fu;
  if (std::isinf(value) || magnitude >= 61440.0f) return sign | 0x7Cu;
  Rounded r = round_to_minifloat(magnitude, 2, 15);
  if (r.biased_exponent >= 31) return sign | 0x7Cu;
  return static_cast<std::uint8_t>(sign | (r.biased_exponent << 2) | r.mantissa);
}

float e5m2_bits_to_float(std::uint8_t bits) {
  if ((bits & 0x7Cu) == 0x7Cu) {
    const float special = (bits & 0x03u) ? std::nanf("") : INFINITY;
    return (bits & 0x80u) ? -special : special;
  }
  return decode_minifloat(bits, 5, 2, 15);
}

double element_to_double(DType dtype, const std::byte* element) {
  auto load = [element]<typename T>(T) {
    T value;
    std::memcpy(&value, element, sizeof(T));
    return value;
  };
  switch (dtype) {
    case DType::float64: return load(double{});
    case DType::float32: return load(float{});
    case DType::float16: return float16_bits_to_float(load(std::uint16_t{}));
    case DType::bfloat16: return bfloat16_bits_to_float(load(std::uint16_t{}));
    case DType::float8_e4m3fn: return e4m3fn_bits_to_float(load(std::uint8_t{}));
    case DType::float8_e5m2: return e5m2_bits_to_float(load(std::uint8_t{}));
    case DType::int64: return static_cast<double>(load(std::int64_t{}));
    case DType::int32: return load(std::int32_t{});
    case DType::int8: return load(std::int8_t{});
    case DType::uint8: return load(std::uint8_t{});
    case DType::boolean: return load(std::uint8_t{}) != 0 ? 1.0 : 0.0;
  }
  return 0.0;
}

void element_from_double(DType dtype, double value, std::byte* element) {
  auto store = [element](auto typed) { std::memcpy(element, &typed, sizeof(typed)); };
  const auto as_float = static_cast<float>(value);
  switch (dtype) {
    case DType::float64: store(value); return;
    case DType::float32: store(as_float); return;
    case DType::float16: store(float_to_float16_bits(as_float)); return;
    case DType::bfloat16: store(float_to_bfloat16_bits(as_float)); return;
    case DType::float8_e4m3fn: store(float_to_e4m3fn_bits(as_float)); return;
    case DType::float8_e5m2: store(float_to_e5m2_bits(as_float)); return;
    case DType::int64: store(static_cast<std::int64_t>(value)); return;
    case DType::int32: store(static_cast<std::int32_t>(value)); return;
    case DType::int8: store(static_cast<std::int8_t>(value)); return;
    case DType::uint8: store(static_cast<std::uint8_t>(value)); return;
    case DType::boolean: store(static_cast<std::uint8_t>(value != 0.0)); return;
  }
}

void internal_assert_failure(const char* condition, const char* file, int line,
                             const std::string& message) {
  throw std::logic_error(fmt::format("internal error (a bug in attnreplay) at {}:{}: {} ({})", file,
                                     line, message, condition));
}

}  // namespace attnreplay
