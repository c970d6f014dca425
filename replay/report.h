#pragma once
// Printers of the results record. They read it and never measure: the same Report gives the
// console table, the JSON (the complete record) and the CSV (fixed columns taken from the JSON).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "replay/results.h"

namespace attnreplay {

void print_table(const Report& report, std::ostream& out);
void print_call_table(const CallResult& call, std::ostream& out);

nlohmann::json report_to_json(const Report& report);
// One call's record as report_to_json writes it (with its kernels), for other records (audit's).
nlohmann::json call_to_json(const CallResult& call);
// A finite number, or null: JSON has no NaN or Infinity.
nlohmann::json json_number(double value);
void write_json(const Report& report, std::ostream& out);

// The CSV's columns, in order; fixed for a given JSON schema version.
const std::vector<std::string>& csv_columns();
void write_csv(const Report& report, std::ostream& out);
// The same from the JSON record, for records joined from parts (attnreplay merge).
void write_csv(const nlohmann::json& record, std::ostream& out);
// One CSV field of a JSON value: null is empty; text with a comma, quote or newline is quoted.
std::string csv_field(const nlohmann::json& value);

}  // namespace attnreplay
