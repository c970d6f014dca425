#pragma once
// The records as JSON, the complete form every printer reads: a run's ("attnreplay.results", also
// what merge joins) and an audit's ("attnreplay.audit"). Plus what the printers share: one call's
// table, which a run prints as each call finishes, and the CSV's fields.
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "replay/judge/audit_summary.h"
#include "replay/results.h"

namespace attnreplay {

nlohmann::json report_to_json(const Report& report);
// One call's record as report_to_json writes it (with its kernels), for other records (audit's).
nlohmann::json call_to_json(const CallResult& call);
nlohmann::json audit_to_json(const AuditReport& report);
// The quantized kernels' options as both records write them.
nlohmann::json quant_options_json(const QuantOptions& options);
// A finite number, or null: JSON has no NaN or Infinity.
nlohmann::json json_number(double value);

// One call of a results record: its shape and work, a row per kernel, each kernel's whole call over
// `baseline`'s (--baseline; empty: the call's fastest exact kernel), then the footnotes; the kernels
// that refused the call only with `every_kernel` (-v; the run's summary lists them once).
void print_call_table(const nlohmann::json& call, std::ostream& out, bool every_kernel, const std::string& baseline);

// The CSV columns of each record, in order; fixed for a given JSON schema version.
const std::vector<std::string>& csv_columns();
const std::vector<std::string>& audit_csv_columns();
// One CSV field of a JSON value: null is empty; text with a comma, quote or newline is quoted.
std::string csv_field(const nlohmann::json& value);

}  // namespace attnreplay
