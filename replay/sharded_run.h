#pragma once
// One process of a `run` shared among processes (replay/sharding.h): what it does before any CUDA
// work (its GPU, its part files, its share of the calls) and once its share is replayed (its part
// written; on rank 0, the other parts waited for and joined into the run's --json and --csv).
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>

#include "replay/call_share.h"
#include "replay/results.h"
#include "replay/sharding.h"

namespace attnreplay {

class ShardedRun {
 public:
  // Records into `report` (its shard_part), which must outlive this.
  ShardedRun(const Shard& shard, int timed_per_group, std::string json_path, std::string csv_path, bool quiet,
             Report& report);
  CallShare& share() { return *share_; }
  // Writes the part; on rank 0 then joins the parts within `merge_wait_s` (unset: twice this
  // process's own time plus a minute; 0: not at all). Returns the exit status.
  int finish(const Report& report, std::optional<double> merge_wait_s);

 private:
  Shard shard_;
  std::string json_path_, csv_path_;
  std::string json_part_, csv_part_;  // empty when neither --json nor --csv was given
  std::filesystem::file_time_type started_ = std::filesystem::file_time_type::clock::now();
  std::chrono::steady_clock::time_point started_steady_ = std::chrono::steady_clock::now();
  std::optional<CallShare> share_;
};

}  // namespace attnreplay
