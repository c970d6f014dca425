#include "replay/run/sharded_run.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <iostream>

#include "formats/errors.h"
#include "replay/measure/gpu.h"
#include "replay/report/record_files.h"
#include "replay/run/merge.h"
#include "replay/run/rerun.h"

namespace attnreplay {
namespace fs = std::filesystem;
namespace {

std::string host_name() {
  char name[256] = {};
  return gethostname(name, sizeof(name) - 1) == 0 ? name : "";
}

}  // namespace

ShardedRun::ShardedRun(const Shard& shard, int timed_per_group, OutputFiles outputs, bool quiet, Report& report)
    : shard_(shard), outputs_(std::move(outputs)) {
  // First: the GPU this process runs on is its local rank's.
  const int gpu = use_local_gpu(shard.local_rank);
  report.shard_part = ShardPart{shard, host_name()};
  share_.emplace(*report.shard_part, timed_per_group);
  if (!outputs_.empty()) {
    // merge reads JSON parts: --json's, or the first other file's name with .json.
    joined_json_ = output_path(outputs_, "json");
    if (joined_json_.empty()) joined_json_ = fs::path(outputs_.front().path).replace_extension(".json").string();
    parts_.push_back({"json", part_path(joined_json_, shard.rank, shard.world_size)});
    for (const OutputFile& output : outputs_) {
      if (output.format != "json") parts_.push_back({output.format, part_path(output.path, shard.rank, shard.world_size)});
    }
  }
  // A part of an earlier run must not pass for this one's while this process works.
  for (const OutputFile& part : parts_) fs::remove(part.path);
  if (gpu >= 0 && gpu != shard.local_rank) {
    std::cerr << fmt::format("attnreplay: warning: local rank {} shares GPU {} with local rank {}: their timings "
                             "disturb each other (start one process per GPU)\n", shard.local_rank, gpu, gpu);
  }
  if (!quiet) {
    std::cerr << fmt::format("attnreplay: {}{}; {}\n", shard.describe(), gpu >= 0 ? fmt::format(", GPU {}", gpu) : "",
                             parts_.empty() ? "no --json or --csv: results are only printed"
                                            : "writes " + parts_.front().path);
  }
}

int ShardedRun::finish(const nlohmann::json& record, std::optional<double> merge_wait_s) {
  write_outputs(record, parts_);
  std::cout << "rank " << shard_.rank << ": ";
  print_summary(record);
  const int own_status = exit_status(record);
  // Rank 0 joins the parts when they land in a shared folder; elsewhere `attnreplay merge` does.
  const std::chrono::duration<double> own_time = std::chrono::steady_clock::now() - started_steady_;
  const double wait_s = merge_wait_s.value_or(2 * own_time.count() + 60);
  if (shard_.rank != 0 || parts_.empty() || wait_s <= 0) return own_status;
  try {
    const ShardPart own{shard_};
    const auto found = wait_for_parts(joined_json_, parts_.front().path, own, started_, std::chrono::duration<double>(wait_s));
    return write_joined_record(merge_parts(found), found.size(), outputs_);
  } catch (const InputError& error) {
    std::cerr << fmt::format("error: {}\nmerge the parts later with: attnreplay merge {} --json {}\n", error.what(),
                             part_pattern(joined_json_, shard_.world_size), shell_quote(joined_json_));
    return kExitFailures;
  }
}

}  // namespace attnreplay
