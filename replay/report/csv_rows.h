#pragma once
// The CSV printers' shared part: one row per (call, kernel) of a record's JSON, each column a JSON
// pointer into the call, the kernel, or the call's input diagnostics (an audit's).
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace attnreplay {

struct CsvColumn {
  enum class From { call, kernel, diagnostics };
  std::string name;
  std::string pointer;  // "/shape/batch", "/timing/median_s"
  From from = From::kernel;
};

// The header, then a row per kernel of each call; a column whose value is absent is empty, a list
// of texts is joined with "; ".
void write_csv_rows(const nlohmann::json& record, const std::vector<CsvColumn>& columns, std::ostream& out);

std::vector<std::string> column_names(const std::vector<CsvColumn>& columns);

}  // namespace attnreplay
