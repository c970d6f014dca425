#pragma once
// How the printers write numbers, one function per kind of figure.
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

namespace attnreplay {

// 3 significant digits with an SI prefix: "1.23 GFLOP".
inline std::string si(double value, std::string_view unit) {
  static constexpr std::pair<double, const char*> kPrefixes[] = {{1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "k"}};
  for (const auto& [scale, prefix] : kPrefixes) {
    if (std::abs(value) >= scale) return fmt::format("{:.3g} {}{}", value / scale, prefix, unit);
  }
  return fmt::format("{:.3g} {}", value, unit);
}

// `digits` significant digits; "nan" for NaN.
inline std::string g(double value, int digits = 3) {
  if (std::isnan(value)) return "nan";
  return fmt::format("{:.{}g}", value, digits);
}

// The same, "-" for NaN (no figure).
inline std::string figure(double value, int digits = 3) { return std::isnan(value) ? "-" : g(value, digits); }

// Near 1 the distance from 1 is what tells kernels apart: "1-2.1e-14" rather than 1.00000000.
inline std::string cosine_text(double value) {
  if (std::isnan(value)) return "-";
  const double off = value - 1.0;
  if (std::abs(off) <= 4 * std::numeric_limits<double>::epsilon()) return "1";  // fp64 rounding of an exact 1
  if (std::abs(off) <= 1e-4) return fmt::format("1{}{:.2g}", off < 0 ? "-" : "+", std::abs(off));
  return fmt::format("{:.6f}", value);
}

}  // namespace attnreplay
