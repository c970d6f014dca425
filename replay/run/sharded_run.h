#pragma once
// One process of a `run` shared among processes (replay/run/sharding.h): what it does before any CUDA
// work (its GPU, its part files, its share of the calls) and once its share is replayed (its part
// written; on rank 0, the other parts waited for and joined into the run's --json and --csv).
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>

#include "replay/report/printer.h"
#include "replay/run/call_share.h"
#include "replay/results.h"
#include "replay/run/sharding.h"

namespace attnreplay {

class ShardedRun {
 public:
  // Records into `report` (its shard_part), which must outlive this. `outputs` are the run's
  // files (--json, --csv): each rank writes its part of each, and rank 0 joins them.
  ShardedRun(const Shard& shard, int timed_per_group, OutputFiles outputs, bool quiet, Report& report);
  CallShare& share() { return *share_; }
  // Writes the part `record` is (report_to_json of the report); on rank 0 then joins the parts
  // within `merge_wait_s` (unset: twice this process's own time plus a minute; 0: not at all).
  // Returns the exit status.
  int finish(const nlohmann::json& record, std::optional<double> merge_wait_s);

 private:
  Shard shard_;
  OutputFiles outputs_;  // the run's
  OutputFiles parts_;    // this rank's, a JSON part among them; empty without --json and --csv
  std::string joined_json_;  // the JSON the parts join into: --json, or the CSV's name with .json
  std::filesystem::file_time_type started_ = std::filesystem::file_time_type::clock::now();
  std::chrono::steady_clock::time_point started_steady_ = std::chrono::steady_clock::now();
  std::optional<CallShare> share_;
};

}  // namespace attnreplay
