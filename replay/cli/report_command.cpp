// `attnreplay report RESULTS.json... -o report.html`: runs' and audits' records (several side by
// side: GPUs, commits) as one self-contained HTML page (replay/report/html_report.h).
#include <CLI/CLI.hpp>

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "replay/cli/command.h"
#include "replay/report/html_report.h"
#include "replay/report/record_files.h"

namespace attnreplay {
namespace {

class ReportCommand final : public Command {
 public:
  void define(CLI::App& app) override {
    app.add_option("records", paths_, "the --json records of attnreplay run or audit")->required();
    app.add_option("-o,--output", output_, "the HTML file to write")->required();
    app.add_option("--baseline", baseline_,
                   "the kernel speed-ups are over (default: each run's --baseline, else its fastest exact kernel)");
  }

  int run(const std::vector<std::string>&) override {
    std::vector<nlohmann::json> records;
    records.reserve(paths_.size());
    for (const std::string& path : paths_) records.push_back(read_record_file(path));
    std::vector<NamedRecord> named;
    for (std::size_t i = 0; i < paths_.size(); ++i) {
      // Records of one name from several folders (a run per GPU) keep their folder in the name.
      const std::filesystem::path path(paths_[i]);
      std::string name = path.filename().string();
      for (std::size_t j = 0; j < paths_.size(); ++j) {
        if (j != i && std::filesystem::path(paths_[j]).filename() == path.filename()) {
          name = (path.parent_path().filename() / path.filename()).string();
        }
      }
      named.push_back({name, &records[i]});
    }
    const std::string page = html_report(named, baseline_);
    write_file_atomically(output_, [&](std::ostream& out) { out << page; });
    std::cout << "wrote " << output_ << " (" << records.size() << " record" << (records.size() == 1 ? "" : "s")
              << "; open it in a browser, no network needed)\n";
    return kExitOk;
  }

 private:
  std::vector<std::string> paths_;
  std::string output_, baseline_;
};

}  // namespace

std::unique_ptr<Command> make_report_command() { return std::make_unique<ReportCommand>(); }

}  // namespace attnreplay
