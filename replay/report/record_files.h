#pragma once
// What a command does with a finished results record: write it to files whole, print its closing
// line, and turn it into the exit status, the same for a run, a sharded run's part and a record
// joined from parts.
#include <functional>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "replay/report/printer.h"

namespace attnreplay {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailures = 1;   // an input, call or kernel failed
inline constexpr int kExitUsage = 2;
inline constexpr int kExitIncorrect = 3;  // --refcheck thresholds exceeded
inline constexpr int kExitRegression = 4;  // compare --fail-on-regression found one

// A record file (a run's, an audit's, a part's) parsed; throws InputError naming the file.
nlohmann::json read_record_file(const std::string& path);

// Writes beside `path`, then renames: a reader never sees half a file. Throws InputError.
void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write);

// "12 calls, 36 results: ...; 0 input errors" on stdout.
void print_summary(const nlohmann::json& record);

// 1 when an input, call or kernel failed, else 3 when a --refcheck threshold was exceeded, else 0.
int exit_status(const nlohmann::json& record);

// A record joined from `parts` parts: written to `outputs`, its closing line printed. Returns its
// exit status.
int write_joined_record(const nlohmann::json& joined, std::size_t parts, const OutputFiles& outputs);

}  // namespace attnreplay
