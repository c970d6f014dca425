#pragma once
// What the printers read out of a record's JSON: numbers (NaN where JSON has null, its NaN), texts,
// and a shape as the table prints it.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace attnreplay {

// A number of the record, absent where it is null, missing or not a number.
inline std::optional<double> optional_number_at(const nlohmann::json& object, const char* key) {
  const auto found = object.find(key);
  if (found == object.end() || !found->is_number()) return std::nullopt;
  return found->get<double>();
}

// The same, NaN where absent.
inline double number_at(const nlohmann::json& object, const char* key) {
  return optional_number_at(object, key).value_or(std::numeric_limits<double>::quiet_NaN());
}

// A text of the record, empty where it is missing or not a string.
inline std::string text_at(const nlohmann::json& object, const char* key) {
  const auto found = object.find(key);
  return found != object.end() && found->is_string() ? found->get<std::string>() : std::string();
}

// The figures a kernel is judged by in a kernel row's "error": over the rows that see a key.
// Records written before 2026-11-29 held the whole call's figures there, and those rows' figures
// (max_abs, mean_abs, rel_l2, cosine) in "rows_with_a_key".
inline const nlohmann::json& judged_figures(const nlohmann::json& error) {
  const auto older = error.find("rows_with_a_key");
  return older != error.end() && older->is_object() ? *older : error;
}

// "b2 hq24 hkv24 sq4250 skv4250 dqk64 dvo64", as AttentionShape::to_string writes it.
inline std::string shape_text(const nlohmann::json& s) {
  return fmt::format("b{} hq{} hkv{} sq{} skv{} dqk{} dvo{}", s.at("batch").get<std::int64_t>(),
                     s.at("heads_q").get<std::int64_t>(), s.at("heads_kv").get<std::int64_t>(),
                     s.at("seq_q").get<std::int64_t>(), s.at("seq_kv").get<std::int64_t>(),
                     s.at("head_dim_qk").get<std::int64_t>(), s.at("head_dim_vo").get<std::int64_t>());
}

}  // namespace attnreplay
