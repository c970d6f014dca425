#pragma once
// Joining the parts of a sharded run (replay/run/sharding.h) into the record one process writes: every
// call once, in the order one process replays them, with the parts' input errors. The CSV is then
// written from the joined JSON, as for any run.
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "replay/results.h"

namespace attnreplay {

// Throws InputError naming the part and what is wrong: a file that is not a part, parts of
// different runs (world size, command line, launch), a rank missing or given twice, a call in two
// parts.
nlohmann::json merge_parts(const std::vector<std::string>& part_paths);

// Rank 0's wait, in a shared folder, for the other ranks' parts of `path` (a --json path): polls
// until each exists and is of this launch (its launch id, or written after `started`), or until
// `timeout` passes. Returns the parts' paths, rank 0's own (`own_part`) first; throws InputError
// naming the parts still missing.
std::vector<std::string> wait_for_parts(const std::string& path, const std::string& own_part, const ShardPart& own,
                                        std::filesystem::file_time_type started, std::chrono::duration<double> timeout);

}  // namespace attnreplay
