#pragma once
// What the printers read out of a record's JSON: numbers (NaN where JSON has null, its NaN), texts,
// and a shape as the table prints it.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>

namespace attnreplay {

// A number of the record, NaN where it is null or absent.
inline double number_at(const nlohmann::json& object, const char* key) {
  const auto found = object.find(key);
  return found == object.end() || !found->is_number() ? std::numeric_limits<double>::quiet_NaN() : found->get<double>();
}

inline std::string text_at(const nlohmann::json& object, const char* key) { return object.value(key, std::string()); }

// "b2 hq24 hkv24 sq4250 skv4250 dqk64 dvo64", as AttentionShape::to_string writes it.
inline std::string shape_text(const nlohmann::json& s) {
  return fmt::format("b{} hq{} hkv{} sq{} skv{} dqk{} dvo{}", s.at("batch").get<std::int64_t>(),
                     s.at("heads_q").get<std::int64_t>(), s.at("heads_kv").get<std::int64_t>(),
                     s.at("seq_q").get<std::int64_t>(), s.at("seq_kv").get<std::int64_t>(),
                     s.at("head_dim_qk").get<std::int64_t>(), s.at("head_dim_vo").get<std::int64_t>());
}

}  // namespace attnreplay
