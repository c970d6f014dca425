#pragma once
// Many GPUs and nodes on the launchers people already use. Each process that torchrun, Slurm's srun
// (or a job array) or mpirun starts reads its rank from the launcher's variables, takes its share
// of the calls (the same deterministic plan in every process, so no process talks to another),
// runs on its local GPU and writes its part of the results; `attnreplay merge` (replay/merge.h)
// joins the parts. The launcher starts the processes and the file system carries the parts.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "replay/results.h"

namespace attnreplay {


// Reads one environment variable; injectable so that tests give a launcher's variables.
using EnvironmentLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvironmentLookup process_environment();

// The shard the launcher's variables give, the first that applies of: torchrun (RANK, WORLD_SIZE,
// LOCAL_RANK), Open MPI (OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK), PMI (PMI_RANK, PMI_SIZE,
// MPI_LOCALRANKID), srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, only inside a job step: the
// batch script itself is one process), each multiplied by a Slurm job array's tasks
// (SLURM_ARRAY_TASK_ID, _MIN, _STEP, _COUNT). One process when none is set. Throws InputError
// naming the variable when one is not a number or a rank is not below its size.
Shard shard_from_launcher(const EnvironmentLookup& environment);

// The variable `run --gpus` (replay/run/local_ranks.h) gives each rank it starts: that launch's id,
// and the sign that --shard RANK/SIZE came from it.
inline constexpr const char* kGpusLaunchVariable = "ATTNREPLAY_GPUS_LAUNCH";

// `--shard`: "auto" (the launcher's), "none" (one process whatever the launcher says), or
// "RANK/SIZE" given by hand (a loop of shell jobs, a cluster without these launchers).
Shard shard_from_flag(const std::string& text, const EnvironmentLookup& environment);

// One call to share out, in replay order.
struct ShareableCall {
  double flops = 0;          // replay_call's work grows with it (the reference, each kernel)
  std::string timing_group;  // calls of one group share a timing (replay/run/timing_groups.h)
};

// What replaying costs on the device that replays, in seconds: rough weights for sharing out, not
// predictions. On a GPU a timing's cost is its floor (the stopping rule's least GPU time and
// samples, each sample's own overhead) for all but the longest calls, so groups of very different
// FLOPs cost about the same; on a CPU a call's FLOPs set its cost.
struct ShareCosts {
  double flops_per_s = 0;     // the rate attention runs at
  double call_overhead_s = 0; // reading, staging, the reference, judging and comparing a call, beside its run
  double timing_floor_s = 0;  // the least one kernel's timing of a group costs
  static ShareCosts gpu();
  static ShareCosts cpu();
};

// The rank that replays each call. Balanced by work: a call costs its run (its FLOPs at the
// device's rate) plus a fixed overhead, and the calls of a timing group pay their timing once. A group (calls of one shape)
// stays on one rank, so that its first-time costs and its timing are paid once, also when every
// call is timed, unless it is bigger than a rank's share, when it is cut into consecutive pieces
// that are timed each. Pieces go largest first to the least loaded rank (ties to the lower rank):
// the same answer in every process. `timed_per_group` 0: every call is timed (--time-every-call).
std::vector<int> assign_calls(const std::vector<ShareableCall>& calls, int world_size, int timed_per_group,
                              const ShareCosts& costs);

// Where a rank writes its part of `path` ("out.json" -> "out.part1-of-4.json").
std::string part_path(const std::string& path, int rank, int world_size);
// The shell pattern of all of them ("out.part*-of-4.json").
std::string part_pattern(const std::string& path, int world_size);

}  // namespace attnreplay
