#include "replay/run/sharding.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <numeric>

#include "formats/errors.h"

namespace attnreplay {
namespace {

// How many runs of a call its timing takes at least (warm-up and samples, with and without
// preparation).
constexpr double kTimingRuns = 20;

std::optional<long long> integer(const EnvironmentLookup& environment, const std::string& name) {
  const auto text = environment(name);
  if (!text) return std::nullopt;
  try {
    std::size_t used = 0;
    const long long value = std::stoll(*text, &used);
    if (used == text->size() && value >= 0) return value;
  } catch (const std::exception&) {
  }
  throw InputError(fmt::format("${}: expected a non-negative integer, got '{}'", name, *text));
}

// A launcher's rank, size and local rank, when all of its variables that matter are set.
std::optional<Shard> launcher_shard(const EnvironmentLookup& environment, const char* launcher, const char* rank_name,
                                    const char* size_name, const char* local_name) {
  const auto rank = integer(environment, rank_name);
  const auto size = integer(environment, size_name);
  if (!rank || !size) return std::nullopt;
  if (*size == 0 || *rank >= *size) {
    throw InputError(fmt::format("${}={} is not below ${}={}", rank_name, *rank, size_name, *size));
  }
  Shard shard;
  shard.rank = static_cast<int>(*rank);
  shard.world_size = static_cast<int>(*size);
  // Without a local rank each process is taken to be alone on its node's GPUs.
  shard.local_rank = static_cast<int>(integer(environment, local_name).value_or(0));
  shard.launcher = launcher;
  return shard;
}

std::string value_or_empty(const EnvironmentLookup& environment, const std::string& name) {
  return environment(name).value_or("");
}

// The launcher that started this process, without a job array's share.
Shard process_launcher(const EnvironmentLookup& environment) {
  if (auto shard = launcher_shard(environment, "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK")) {
    // torchrun's --standalone makes a fresh id; a fixed --rdzv-id is the user's to keep apart.
    const std::string run_id = value_or_empty(environment, "TORCHELASTIC_RUN_ID");
    if (!run_id.empty() && run_id != "none") shard->launch_id = "torchrun " + run_id;
    return *shard;
  }
  if (auto shard = launcher_shard(environment, "Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                  "OMPI_COMM_WORLD_LOCAL_RANK")) {
    for (const char* name : {"PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid", "OMPI_MCA_ess_base_jobid"}) {
      if (const auto id = environment(name)) {
        shard->launch_id = fmt::format("Open MPI {}", *id);
        break;
      }
    }
    return *shard;
  }
  if (auto shard = launcher_shard(environment, "PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID")) {
    if (!environment("MPI_LOCALRANKID")) shard->local_rank = static_cast<int>(integer(environment, "PMI_LOCAL_RANK").value_or(0));
    return *shard;
  }
  // The batch script of an sbatch job also sees SLURM_PROCID=0 and SLURM_NTASKS, but it is one
  // process: only the tasks of a job step (srun) share the work.
  if (environment("SLURM_STEP_ID")) {
    const char* size_name = environment("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
    if (auto shard = launcher_shard(environment, "srun", "SLURM_PROCID", size_name, "SLURM_LOCALID")) {
      shard->launch_id = fmt::format("Slurm job {} step {}", value_or_empty(environment, "SLURM_JOB_ID"),
                                     value_or_empty(environment, "SLURM_STEP_ID"));
      return *shard;
    }
  }
  return Shard{};
}

}  // namespace

std::string Shard::describe() const {
  if (!sharded()) return "one process";
  return fmt::format("rank {} of {} ({}, local rank {})", rank, world_size, launcher, local_rank);
}

EnvironmentLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (!value) return std::nullopt;
    return std::string(value);
  };
}

Shard shard_from_launcher(const EnvironmentLookup& environment) {
  Shard shard = process_launcher(environment);
  const auto array_count = integer(environment, "SLURM_ARRAY_TASK_COUNT");
  const auto array_id = integer(environment, "SLURM_ARRAY_TASK_ID");
  if (!array_count || !array_id || *array_count <= 1) return shard;
  // Array task ids run from _MIN in steps of _STEP (--array=0-15:4 gives 0, 4, 8, 12).
  const long long first = integer(environment, "SLURM_ARRAY_TASK_MIN").value_or(0);
  const long long step = std::max(1LL, integer(environment, "SLURM_ARRAY_TASK_STEP").value_or(1));
  if (*array_id < first || (*array_id - first) % step != 0 || (*array_id - first) / step >= *array_count) {
    throw InputError(fmt::format("$SLURM_ARRAY_TASK_ID={} is not one of {} tasks from {} in steps of {} (an array "
                                 "with gaps, such as --array=1,5,9, cannot be shared out: give --shard RANK/SIZE)",
                                 *array_id, *array_count, first, step));
  }
  const int index = static_cast<int>((*array_id - first) / step);
  const std::string inner = shard.sharded() ? shard.launcher + " in a Slurm job array" : "Slurm job array";
  shard.rank = index * shard.world_size + shard.rank;
  shard.world_size *= static_cast<int>(*array_count);
  shard.launcher = inner;
  shard.launch_id = fmt::format("Slurm array job {}", value_or_empty(environment, "SLURM_ARRAY_JOB_ID"));
  return shard;
}

Shard shard_from_flag(const std::string& text, const EnvironmentLookup& environment) {
  if (text == "auto") return shard_from_launcher(environment);
  if (text == "none") return Shard{};
  const auto slash = text.find('/');
  try {
    std::size_t used_rank = 0, used_size = 0;
    if (slash == std::string::npos) throw std::invalid_argument(text);
    const int rank = std::stoi(text.substr(0, slash), &used_rank);
    const int size = std::stoi(text.substr(slash + 1), &used_size);
    if (used_rank != slash || used_size != text.size() - slash - 1 || rank < 0 || size < 1 || rank >= size) {
      throw std::invalid_argument(text);
    }
    Shard shard;
    shard.rank = rank;
    shard.world_size = size;
    shard.local_rank = static_cast<int>(integer(environment, "LOCAL_RANK").value_or(0));
    shard.launcher = "--shard";
    // A rank that `run --gpus` started (replay/run/local_ranks.h): its launch's id.
    if (const auto launch = environment(kGpusLaunchVariable)) {
      shard.launcher = "--gpus";
      shard.launch_id = *launch;
    }
    return shard;
  } catch (const std::invalid_argument&) {
  } catch (const std::out_of_range&) {
  }
  throw InputError(fmt::format("--shard: expected auto, none or RANK/SIZE with RANK below SIZE, got '{}'", text));
}

namespace {

// The calls' timing groups, in order of first appearance. When every call is timed they are still
// kept together: a shape's first-time costs (cuDNN's plans, compilation, autotuning) are then paid
// by one rank, once.
std::vector<std::vector<std::size_t>> timing_groups_of(const std::vector<ShareableCall>& calls) {
  std::vector<std::vector<std::size_t>> groups;
  std::map<std::string, std::size_t> group_of;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const auto [found, added] = group_of.emplace(calls[i].timing_group, groups.size());
    if (added) groups.emplace_back();
    groups[found->second].push_back(i);
  }
  return groups;
}

}  // namespace

// The GPU's from an H100 (bench/results/2026-11-27-h100-replay-efficiency/: a decode's group and a
// prefill's each about 1 s, 10 ms a call beside its timings); the CPU's weigh a call's FLOPs as
// before there was a floor (2 GFLOP of overhead a call).
ShareCosts ShareCosts::gpu() { return {3e14, 0.01, 0.1}; }
ShareCosts ShareCosts::cpu() { return {2e10, 0.1, 0.0}; }

std::vector<int> assign_calls(const std::vector<ShareableCall>& calls, int world_size, int timed_per_group,
                              const ShareCosts& costs) {
  std::vector<int> rank_of(calls.size(), 0);
  if (world_size <= 1 || calls.empty()) return rank_of;
  const std::vector<std::vector<std::size_t>> groups = timing_groups_of(calls);
  // A call once, with what replaying it costs beside its run.
  const auto call_s = [&](double flops) { return flops / costs.flops_per_s + costs.call_overhead_s; };
  // A timing of a call: its runs, or its floor where that is more.
  const auto timing_s = [&](double largest_flops) { return std::max(costs.timing_floor_s, kTimingRuns * call_s(largest_flops)); };
  // What replaying calls group[begin, end) costs on one rank: every call, and its timed calls'
  // timing (as long as the largest's).
  const auto cost_of = [&](const std::vector<std::size_t>& group, std::size_t begin, std::size_t end) {
    double cost = 0, largest = 0;
    for (std::size_t i = begin; i < end; ++i) {
      cost += call_s(calls[group[i]].flops);
      largest = std::max(largest, calls[group[i]].flops);
    }
    const std::size_t timed = timed_per_group <= 0 ? end - begin : std::min<std::size_t>(end - begin, timed_per_group);
    return cost + static_cast<double>(timed) * timing_s(largest);
  };
  std::vector<double> group_cost;
  for (const auto& group : groups) group_cost.push_back(cost_of(group, 0, group.size()));
  std::vector<std::size_t> by_cost(groups.size());
  std::iota(by_cost.begin(), by_cost.end(), 0);
  std::stable_sort(by_cost.begin(), by_cost.end(), [&](std::size_t a, std::size_t b) { return group_cost[a] > group_cost[b]; });
  double unassigned = std::accumulate(group_cost.begin(), group_cost.end(), 0.0);

  // Largest group first, to the least loaded rank (ties to the lower); a group that does not fit
  // in that rank's room up to a share gives it the calls that do, and the rest goes on. A cut
  // adds a timing, so the share is worked out anew before each piece.
  std::vector<double> load(static_cast<std::size_t>(world_size), 0.0);
  for (std::size_t g : by_cost) {
    const auto& group = groups[g];
    unassigned -= group_cost[g];
    // Each rank takes one piece of a group at most (until every rank has one), so that a group is
    // cut into as few pieces as there are ranks it needs.
    std::vector<bool> has_piece(static_cast<std::size_t>(world_size), false);
    for (std::size_t begin = 0; begin < group.size();) {
      const double rest = cost_of(group, begin, group.size());
      const double share = (std::accumulate(load.begin(), load.end(), 0.0) + unassigned + rest) / world_size;
      std::size_t rank = 0;
      bool last_rank = true;
      for (std::size_t r = 0; r < load.size(); ++r) {
        if (has_piece[r]) continue;
        if (last_rank || load[r] < load[rank]) rank = r;
        last_rank = false;
      }
      if (last_rank) rank = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      last_rank = last_rank || std::count(has_piece.begin(), has_piece.end(), false) == 1;
      // A cut costs the piece cut off its own timing: worth it only when the overflow is more.
      double largest = 0;
      for (std::size_t i = begin; i < group.size(); ++i) largest = std::max(largest, calls[group[i]].flops);
      const double cut = std::max(timed_per_group, 1) * timing_s(largest);
      double room = share - load[rank];
      std::size_t end = group.size();
      if (!last_rank && rest - room > cut) {
        // The share with the timings of the cuts to come, were the rest spread over the ranks left.
        const auto ranks_left = std::count(has_piece.begin(), has_piece.end(), false);
        room += cut * static_cast<double>(ranks_left - 1) / world_size;
        // The longest run that fits, found by halving; one call at least, so that each piece moves on.
        std::size_t fits = begin + 1, too_many = group.size();
        while (too_many - fits > 1) {
          const std::size_t middle = fits + (too_many - fits) / 2;
          (cost_of(group, begin, middle) <= room ? fits : too_many) = middle;
        }
        end = fits;
      }
      load[rank] += cost_of(group, begin, end);
      has_piece[rank] = true;
      for (std::size_t i = begin; i < end; ++i) rank_of[group[i]] = static_cast<int>(rank);
      begin = end;
    }
  }
  return rank_of;
}

namespace {

std::string part_name(const std::string& path, const std::string& rank, int world_size) {
  const std::filesystem::path file(path);
  const std::string name = fmt::format("{}.part{}-of-{}{}", file.stem().string(), rank, world_size, file.extension().string());
  return (file.parent_path() / name).string();
}

}  // namespace

std::string part_path(const std::string& path, int rank, int world_size) {
  return part_name(path, std::to_string(rank), world_size);
}

std::string part_pattern(const std::string& path, int world_size) { return part_name(path, "*", world_size); }

}  // namespace attnreplay
