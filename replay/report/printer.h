#pragma once
// Printers of finished records. Every printer reads the record as JSON, the complete form --json
// writes ("attnreplay.results" from run and merge, "attnreplay.audit" from audit), and writes one
// format; commands pick theirs by name. Nothing here measures.
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace attnreplay {

class Printer {
 public:
  virtual ~Printer() = default;
  virtual void print(const nlohmann::json& record, std::ostream& out) const = 0;
};

// The printer of `format` ("json", "csv", "table", "html") for records of the record's "schema"; throws
// std::logic_error for a pair no printer serves.
const Printer& printer_for(std::string_view format, const nlohmann::json& record);

// A file a command writes its record to, in a format: --json out.json is {"json", "out.json"}.
struct OutputFile {
  std::string format;
  std::string path;
};
using OutputFiles = std::vector<OutputFile>;

// The files --json, --csv and --html name (any may be empty).
OutputFiles output_files(const std::string& json_path, const std::string& csv_path, const std::string& html_path = "");
// The path of `format` among `files`, or empty.
std::string output_path(const OutputFiles& files, std::string_view format);

// Writes `record` in each file's format, each file whole or not at all. Throws InputError.
void write_outputs(const nlohmann::json& record, const OutputFiles& files);

}  // namespace attnreplay
