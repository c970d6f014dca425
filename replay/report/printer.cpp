#include "replay/report/printer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <stdexcept>

#include "replay/report/record_files.h"

namespace attnreplay {

// Each printer's own file defines it.
const Printer& json_printer();
const Printer& results_table_printer();
const Printer& results_csv_printer();
const Printer& audit_table_printer();
const Printer& audit_csv_printer();
const Printer& html_report_printer();

namespace {

struct PrinterEntry {
  std::string_view schema;  // empty: any
  std::string_view format;
  const Printer& (*printer)();
};

constexpr PrinterEntry kPrinters[] = {
    {"", "json", json_printer},
    {"attnreplay.results", "table", results_table_printer},
    {"attnreplay.results", "csv", results_csv_printer},
    {"attnreplay.audit", "table", audit_table_printer},
    {"attnreplay.audit", "csv", audit_csv_printer},
    {"", "html", html_report_printer},
};

}  // namespace

const Printer& printer_for(std::string_view format, const nlohmann::json& record) {
  const std::string schema = record.value("schema", std::string());
  for (const PrinterEntry& entry : kPrinters) {
    if (entry.format == format && (entry.schema.empty() || entry.schema == schema)) return entry.printer();
  }
  throw std::logic_error(fmt::format("no {} printer for records of schema '{}'", format, schema));
}

OutputFiles output_files(const std::string& json_path, const std::string& csv_path, const std::string& html_path) {
  OutputFiles files;
  if (!json_path.empty()) files.push_back({"json", json_path});
  if (!csv_path.empty()) files.push_back({"csv", csv_path});
  if (!html_path.empty()) files.push_back({"html", html_path});
  return files;
}

std::string output_path(const OutputFiles& files, std::string_view format) {
  for (const OutputFile& file : files)
    if (file.format == format) return file.path;
  return {};
}

void write_outputs(const nlohmann::json& record, const OutputFiles& files) {
  for (const OutputFile& file : files) {
    const Printer& printer = printer_for(file.format, record);
    write_file_atomically(file.path, [&](std::ostream& out) { printer.print(record, out); });
  }
}

}  // namespace attnreplay
