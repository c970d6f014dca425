#include "replay/run/sharding.h"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "formats/errors.h"

namespace attnreplay {
namespace {

using Catch::Matchers::ContainsSubstring;

EnvironmentLookup variables(std::map<std::string, std::string> values) {
  return [values](const std::string& name) -> std::optional<std::string> {
    const auto found = values.find(name);
    if (found == values.end()) return std::nullopt;
    return found->second;
  };
}

TEST_CASE("shard_from_launcher: each launcher's variables") {
  const Shard alone = shard_from_launcher(variables({}));
  CHECK_FALSE(alone.sharded());
  CHECK(alone.describe() == "one process");

  const Shard torchrun = shard_from_launcher(
      variables({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"TORCHELASTIC_RUN_ID", "abc"}}));
  CHECK((torchrun.rank == 5 && torchrun.world_size == 8 && torchrun.local_rank == 1));
  CHECK(torchrun.launcher == "torchrun");
  CHECK(torchrun.launch_id == "torchrun abc");
  CHECK(torchrun.describe() == "rank 5 of 8 (torchrun, local rank 1)");

  const Shard ompi = shard_from_launcher(variables(
      {{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
       {"PMIX_NAMESPACE", "prterun-x-1@1"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_STEP_ID", "0"}}));
  CHECK((ompi.rank == 3 && ompi.world_size == 4 && ompi.local_rank == 1 && ompi.launcher == "Open MPI"));
  CHECK(ompi.launch_id == "Open MPI prterun-x-1@1");

  const Shard pmi = shard_from_launcher(variables({{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}, {"MPI_LOCALRANKID", "2"}}));
  CHECK((pmi.rank == 2 && pmi.world_size == 3 && pmi.local_rank == 2 && pmi.launcher == "PMI"));

  const Shard srun = shard_from_launcher(variables({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "2"},
                                                    {"SLURM_STEP_ID", "1"}, {"SLURM_JOB_ID", "42"}}));
  CHECK((srun.rank == 6 && srun.world_size == 8 && srun.local_rank == 2 && srun.launcher == "srun"));
  CHECK(srun.launch_id == "Slurm job 42 step 1");
}

TEST_CASE("shard_from_launcher: sbatch's script is one process; a job array multiplies the launcher's ranks") {
  CHECK_FALSE(shard_from_launcher(variables({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}})).sharded());

  const Shard array = shard_from_launcher(variables({{"SLURM_ARRAY_TASK_ID", "12"}, {"SLURM_ARRAY_TASK_MIN", "0"},
                                                     {"SLURM_ARRAY_TASK_STEP", "4"}, {"SLURM_ARRAY_TASK_COUNT", "4"},
                                                     {"SLURM_ARRAY_JOB_ID", "7"}}));
  CHECK((array.rank == 3 && array.world_size == 4 && array.launcher == "Slurm job array"));
  CHECK(array.launch_id == "Slurm array job 7");

  // Two tasks of srun in each of three array tasks: six ranks.
  const Shard both = shard_from_launcher(
      variables({{"SLURM_ARRAY_TASK_ID", "2"}, {"SLURM_ARRAY_TASK_MIN", "1"}, {"SLURM_ARRAY_TASK_COUNT", "3"},
                 {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"}}));
  CHECK((both.rank == 3 && both.world_size == 6 && both.launcher == "srun in a Slurm job array"));

  CHECK_THROWS_WITH(shard_from_launcher(variables({{"SLURM_ARRAY_TASK_ID", "5"}, {"SLURM_ARRAY_TASK_MIN", "1"},
                                                   {"SLURM_ARRAY_TASK_STEP", "2"}, {"SLURM_ARRAY_TASK_COUNT", "2"}})),
                    ContainsSubstring("$SLURM_ARRAY_TASK_ID=5 is not one of 2 tasks from 1 in steps of 2"));
}

TEST_CASE("shard_from_launcher and --shard: bad values are named") {
  CHECK_THROWS_WITH(shard_from_launcher(variables({{"RANK", "4"}, {"WORLD_SIZE", "4"}})),
                    ContainsSubstring("$RANK=4 is not below $WORLD_SIZE=4"));
  CHECK_THROWS_WITH(shard_from_launcher(variables({{"RANK", "x"}, {"WORLD_SIZE", "4"}})),
                    ContainsSubstring("$RANK: expected a non-negative integer, got 'x'"));
  const auto env = variables({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  CHECK(shard_from_flag("auto", env).rank == 1);
  CHECK_FALSE(shard_from_flag("none", env).sharded());
  const Shard by_hand = shard_from_flag("2/3", variables({}));
  CHECK((by_hand.rank == 2 && by_hand.world_size == 3 && by_hand.launcher == "--shard"));
  for (const char* bad : {"3/3", "1/0", "-1/2", "1/2x", "1", "a/b", ""}) {
    CHECK_THROWS_WITH(shard_from_flag(bad, env), ContainsSubstring("--shard: expected auto, none or RANK/SIZE"));
  }
}

const ShareCosts kCpu = ShareCosts::cpu();

std::vector<double> loads(const std::vector<ShareableCall>& calls, const std::vector<int>& rank_of, int world) {
  std::vector<double> load(static_cast<std::size_t>(world), 0);
  for (std::size_t i = 0; i < calls.size(); ++i) load[static_cast<std::size_t>(rank_of[i])] += calls[i].flops;
  return load;
}

TEST_CASE("assign_calls: groups kept whole when that balances, cut when one is bigger than a share") {
  // 200 calls in 4 shapes, interleaved as a model's layers make them.
  std::vector<ShareableCall> calls;
  const double flops[] = {4e11, 3e11, 2e11, 1e11};
  for (int i = 0; i < 200; ++i) calls.push_back({flops[i % 4], "shape " + std::to_string(i % 4)});
  const auto rank_of = assign_calls(calls, 2, 1, kCpu);
  REQUIRE(rank_of.size() == calls.size());
  CHECK(assign_calls(calls, 2, 1, kCpu) == rank_of);  // the same plan in every process
  std::map<std::string, std::set<int>> ranks_of_group;
  for (std::size_t i = 0; i < calls.size(); ++i) ranks_of_group[calls[i].timing_group].insert(rank_of[i]);
  for (const auto& [group, ranks] : ranks_of_group) CHECK(ranks.size() == 1);  // each timed once
  const auto load = loads(calls, rank_of, 2);
  CHECK(std::max(load[0], load[1]) / std::min(load[0], load[1]) < 1.1);

  // One shape only (a video model's 1,500 calls): cut into consecutive runs, one per rank.
  const std::vector<ShareableCall> one_shape(1500, {1e11, "only"});
  const auto cut = assign_calls(one_shape, 4, 1, kCpu);
  int changes = 0;
  for (std::size_t i = 1; i < cut.size(); ++i) changes += cut[i] != cut[i - 1];
  CHECK(changes == 3);
  const auto load4 = loads(one_shape, cut, 4);
  CHECK(*std::max_element(load4.begin(), load4.end()) / *std::min_element(load4.begin(), load4.end()) < 1.1);

  // Timed call by call: a shape's calls still on one rank where they fit a share (its first-time
  // costs paid once), and balanced over more ranks than shapes.
  const auto two_ranks = assign_calls(calls, 4, 0, kCpu);
  std::map<std::string, std::set<int>> ranks_when_each_timed;
  for (std::size_t i = 0; i < calls.size(); ++i) ranks_when_each_timed[calls[i].timing_group].insert(two_ranks[i]);
  CHECK(ranks_when_each_timed["shape 3"].size() == 1);
  CHECK(ranks_when_each_timed["shape 2"].size() == 1);
  const auto each = assign_calls(calls, 8, 0, kCpu);
  const auto load8 = loads(calls, each, 8);
  // Keeping shapes together costs a little balance at eight ranks for four shapes.
  CHECK(*std::max_element(load8.begin(), load8.end()) / *std::min_element(load8.begin(), load8.end()) < 1.15);

  CHECK(assign_calls(calls, 1, 1, kCpu) == std::vector<int>(calls.size(), 0));
  // More ranks than calls: some get none, none gets two.
  const auto sparse = assign_calls({{1e9, "a"}, {1e9, "b"}}, 4, 1, kCpu);
  CHECK(sparse[0] != sparse[1]);
}

TEST_CASE("assign_calls on a GPU: groups whose timings cost their floor are shared out by count, not FLOPs") {
  // A serving trace as bench/replay_efficiency.py makes it: 63 forwards of 16 layers, a few prefills
  // (~2.4 GFLOP a call) among decode steps (~26 MFLOP), each forward's 16 calls one timing group. On
  // the H100 each group took about 1 s whatever its FLOPs: the timings sit at their floor.
  std::vector<ShareableCall> calls;
  for (int forward = 0; forward < 63; ++forward) {
    const double flops = forward % 16 == 0 ? 2.4e9 * (1 + forward % 3) : 2.6e7 * (1 + forward % 5);
    for (int layer = 0; layer < 16; ++layer) calls.push_back({flops, "forward " + std::to_string(forward)});
  }
  const auto rank_of = assign_calls(calls, 4, 1, ShareCosts::gpu());
  CHECK(assign_calls(calls, 4, 1, ShareCosts::gpu()) == rank_of);
  std::vector<std::set<std::string>> groups_of(4);
  for (std::size_t i = 0; i < calls.size(); ++i) groups_of[static_cast<std::size_t>(rank_of[i])].insert(calls[i].timing_group);
  std::size_t in_all = 0;
  for (const auto& groups : groups_of) {
    CHECK(groups.size() >= 15);
    CHECK(groups.size() <= 16);
    in_all += groups.size();
  }
  CHECK(in_all == 63);  // no group cut
  // On the CPU the same calls' FLOPs decide: a rank with prefills takes fewer groups.
  const auto on_cpu = assign_calls(calls, 4, 1, ShareCosts::cpu());
  std::vector<std::set<std::string>> cpu_groups(4);
  for (std::size_t i = 0; i < calls.size(); ++i) cpu_groups[static_cast<std::size_t>(on_cpu[i])].insert(calls[i].timing_group);
  CHECK(std::any_of(cpu_groups.begin(), cpu_groups.end(), [](const auto& groups) { return groups.size() < 15; }));
}

TEST_CASE("part_path: the rank and size before the extension") {
  CHECK(part_path("out/results.json", 3, 8) == "out/results.part3-of-8.json");
  CHECK(part_path("r.csv", 0, 2) == "r.part0-of-2.csv");
  CHECK(part_pattern("out/results.json", 8) == "out/results.part*-of-8.json");
}

}  // namespace
}  // namespace attnreplay
