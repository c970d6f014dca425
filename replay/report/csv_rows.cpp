#include "replay/report/csv_rows.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <ostream>

#include "replay/report/records.h"

namespace attnreplay {

std::string csv_field(const nlohmann::json& value) {
  if (value.is_null()) return "";
  std::string text;
  if (value.is_string()) {
    text = value.get<std::string>();
  } else if (value.is_array() && std::all_of(value.begin(), value.end(), [](const auto& v) { return v.is_string(); })) {
    text = fmt::format("{}", fmt::join(value.get<std::vector<std::string>>(), "; "));
  } else {
    text = value.dump();
  }
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + '"';
}

std::vector<std::string> column_names(const std::vector<CsvColumn>& columns) {
  std::vector<std::string> names;
  for (const CsvColumn& column : columns) names.push_back(column.name);
  return names;
}

void write_csv_rows(const nlohmann::json& record, const std::vector<CsvColumn>& columns, std::ostream& out) {
  out << fmt::format("{}\n", fmt::join(column_names(columns), ","));
  static const nlohmann::json kNone = nlohmann::json::object();
  for (const auto& call : record.at("calls")) {
    const nlohmann::json& diagnostics = call.contains("diagnostics") ? call.at("diagnostics") : kNone;
    for (const auto& kernel : call.at("kernels")) {
      std::vector<std::string> fields;
      for (const CsvColumn& column : columns) {
        const nlohmann::json& from = column.from == CsvColumn::From::call     ? call
                                     : column.from == CsvColumn::From::kernel ? kernel
                                                                              : diagnostics;
        const nlohmann::json::json_pointer pointer(column.pointer);
        fields.push_back(from.contains(pointer) ? csv_field(from.at(pointer)) : "");
      }
      out << fmt::format("{}\n", fmt::join(fields, ","));
    }
  }
}

}  // namespace attnreplay
