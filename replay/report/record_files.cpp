#include "replay/report/record_files.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>

#include "formats/errors.h"

namespace attnreplay {

nlohmann::json read_record_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(fmt::format("{}: cannot open", path));
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {
    throw InputError(fmt::format("{}: not JSON ({})", path, error.what()));
  }
}

void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial);
    if (!out) throw InputError(fmt::format("{}: cannot open for writing", path));
    write(out);
    if (!out.flush()) throw InputError(fmt::format("{}: write failed", path));
  }
  std::filesystem::rename(partial, path);
}

void print_summary(const nlohmann::json& record) {
  std::map<std::string, int> counts;
  int runs = 0;
  for (const auto& call : record["calls"])
    for (const auto& kernel : call["kernels"]) ++counts[kernel["status"].get<std::string>()], ++runs;
  std::vector<std::string> parts;
  for (const auto& [name, count] : counts) parts.push_back(fmt::format("{} {}", count, name));
  std::cout << fmt::format("{} calls, {} results: {}; {} input errors\n", record["calls"].size(), runs,
                           parts.empty() ? "none" : fmt::format("{}", fmt::join(parts, ", ")),
                           record["input_errors"].size());
}

int exit_status(const nlohmann::json& record) {
  bool incorrect = false;
  if (!record["input_errors"].empty()) return kExitFailures;
  for (const auto& call : record["calls"]) {
    for (const auto& kernel : call["kernels"]) {
      if (kernel["status"] == "failed") return kExitFailures;
      incorrect = incorrect || kernel["status"] == "incorrect";
    }
  }
  return incorrect ? kExitIncorrect : kExitOk;
}

int write_joined_record(const nlohmann::json& joined, std::size_t parts, const OutputFiles& outputs) {
  write_outputs(joined, outputs);
  std::cout << fmt::format("merged {} parts: ", parts);
  print_summary(joined);
  return exit_status(joined);
}

}  // namespace attnreplay
