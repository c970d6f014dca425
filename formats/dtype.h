#pragma once
// Element types an attention call can carry, with bit-exact conversions to and from double.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace attnreplay {

enum class DType : std::uint8_t {
  float64,
  float32,
  float16,
  bfloat16,
  float8_e4m3fn,
  float8_e5m2,
  int64,
  int32,
  int8,
  uint8,
  boolean,
};

inline constexpr DType kAllDTypes[] = {DType::float64, DType::float32,       DType::float16,
                                       DType::bfloat16, DType::float8_e4m3fn, DType::float8_e5m2,
                                       DType::int64,   DType::int32,         DType::int8,
                                       DType::uint8,   DType::boolean};

std::size_t dtype_size(DType dtype);
bool dtype_is_floating(DType dtype);
// torch's spelling without the "torch." prefix, e.g. "bfloat16": the name used in every file.
std::string_view dtype_name(DType dtype);
// Accepts torch's names with or without "torch.", and the short forms bf16, fp16, fp32, fp8.
std::optional<DType> parse_dtype(std::string_view text);
// The floating dtypes' names, as messages list what a flag takes.
const std::vector<std::string>& floating_dtype_names();

double element_to_double(DType dtype, const std::byte* element);
// Rounds to nearest even through float, as torch's casts do. fp8 e4m3fn has no infinity: like
// torch, magnitudes above 464 become NaN (quantizing kernels clamp before casting).
void element_from_double(DType dtype, double value, std::byte* element);

std::uint16_t float_to_bfloat16_bits(float value);
float bfloat16_bits_to_float(std::uint16_t bits);
std::uint16_t float_to_float16_bits(float value);
float float16_bits_to_float(std::uint16_t bits);
std::uint8_t float_to_e4m3fn_bits(float value);
float e4m3fn_bits_to_float(std::uint8_t bits);
std::uint8_t float_to_e5m2_bits(float value);
float e5m2_bits_to_float(std::uint8_t bits);

}  // namespace attnreplay
