// `attnreplay merge`: the parts of a sharded run joined into the record one process would have
// written (replay/run/merge.h).
#include <CLI/CLI.hpp>

#include <iostream>

#include "replay/cli/command.h"
#include "replay/report/printer.h"
#include "replay/report/record_files.h"
#include "replay/run/merge.h"

namespace attnreplay {
namespace {

class MergeCommand final : public Command {
 public:
  void define(CLI::App& app) override {
    app.add_option("parts", parts_, "the parts' JSON files (out.part*-of-N.json)")->required();
    app.add_option("--json", json_path_, "write the joined record");
    app.add_option("--csv", csv_path_, "write one row per call and kernel");
  }

  int run(const std::vector<std::string>&) override {
    const OutputFiles outputs = output_files(json_path_, csv_path_);
    if (outputs.empty()) throw UsageError("merge: give --json or --csv (or both) to write");
    const nlohmann::json joined = merge_parts(parts_);
    for (const auto& error : joined["input_errors"]) std::cerr << "error: " << error.get<std::string>() << '\n';
    return write_joined_record(joined, parts_.size(), outputs);
  }

 private:
  std::vector<std::string> parts_;
  std::string json_path_, csv_path_;
};

}  // namespace

std::unique_ptr<Command> make_merge_command() { return std::make_unique<MergeCommand>(); }

}  // namespace attnreplay
