#include "replay/sharded_run.h"

#include <fmt/format.h>
#include <unistd.h>

#include <iostream>

#include "formats/errors.h"
#include "replay/merge.h"
#include "replay/record_files.h"
#include "replay/report.h"
#include "replay/runner.h"
#ifdef ATTNREPLAY_HAVE_CUDA
#include "replay/cuda_timing.h"
#endif

namespace attnreplay {
namespace fs = std::filesystem;
namespace {

std::string host_name() {
  char name[256] = {};
  return gethostname(name, sizeof(name) - 1) == 0 ? name : "";
}

// The JSON the run writes: --json, or the CSV's name with .json (merge reads JSON parts).
std::string json_of(const std::string& json_path, const std::string& csv_path) {
  return json_path.empty() ? fs::path(csv_path).replace_extension(".json").string() : json_path;
}

}  // namespace

ShardedRun::ShardedRun(const Shard& shard, int timed_per_group, std::string json_path, std::string csv_path, bool quiet,
                       Report& report)
    : shard_(shard), json_path_(std::move(json_path)), csv_path_(std::move(csv_path)) {
  // First: the GPU this process runs on is its local rank's.
#ifdef ATTNREPLAY_HAVE_CUDA
  const int gpu = use_local_gpu(shard.local_rank);
#else
  const int gpu = -1;
#endif
  report.shard_part = ShardPart{shard, host_name()};
  share_.emplace(*report.shard_part, timed_per_group);
  if (!json_path_.empty() || !csv_path_.empty()) {
    json_part_ = part_path(json_of(json_path_, csv_path_), shard.rank, shard.world_size);
    if (!csv_path_.empty()) csv_part_ = part_path(csv_path_, shard.rank, shard.world_size);
  }
  // A part of an earlier run must not pass for this one's while this process works.
  for (const std::string& part : {json_part_, csv_part_}) {
    if (!part.empty()) fs::remove(part);
  }
  if (gpu >= 0 && gpu != shard.local_rank) {
    std::cerr << fmt::format("attnreplay: warning: local rank {} shares GPU {} with local rank {}: their timings "
                             "disturb each other (start one process per GPU)\n", shard.local_rank, gpu, gpu);
  }
  if (!quiet) {
    std::cerr << fmt::format("attnreplay: {}{}; {}\n", shard.describe(), gpu >= 0 ? fmt::format(", GPU {}", gpu) : "",
                             json_part_.empty() ? "no --json or --csv: results are only printed" : "writes " + json_part_);
  }
}

int ShardedRun::finish(const Report& report, std::optional<double> merge_wait_s) {
  if (!json_part_.empty()) write_file_atomically(json_part_, [&](std::ostream& out) { write_json(report, out); });
  if (!csv_part_.empty()) write_file_atomically(csv_part_, [&](std::ostream& out) { write_csv(report, out); });
  const nlohmann::json own = report_to_json(report);
  std::cout << "rank " << shard_.rank << ": ";
  print_summary(own);
  const int own_status = exit_status(own);
  // Rank 0 joins the parts when they land in a shared folder; elsewhere `attnreplay merge` does.
  const std::chrono::duration<double> own_time = std::chrono::steady_clock::now() - started_steady_;
  const double wait_s = merge_wait_s.value_or(2 * own_time.count() + 60);
  if (shard_.rank != 0 || json_part_.empty() || wait_s <= 0) return own_status;
  const std::string joined = json_of(json_path_, csv_path_);
  try {
    const auto found = wait_for_parts(joined, json_part_, *report.shard_part, started_,
                                      std::chrono::duration<double>(wait_s));
    return write_joined_record(merge_parts(found), found.size(), json_path_, csv_path_);
  } catch (const InputError& error) {
    std::cerr << fmt::format("error: {}\nmerge the parts later with: attnreplay merge {} --json {}\n", error.what(),
                             part_pattern(joined, shard_.world_size), shell_quote(joined));
    return kExitFailures;
  }
}

}  // namespace attnreplay
