#pragma once
// `attnreplay run --gpus N`: attnreplay as its own launcher on one machine. It starts N processes
// of the same command, each with `--shard RANK/N` and LOCAL_RANK=RANK (so each takes its own GPU
// and its share of the calls, replay/run/sharding.h), waits for them, and answers with rank 0's
// exit status (rank 0 joins the parts). No Python launcher and no rendezvous: torchrun's own
// start-up cost a two-GPU replay of 40 s about 3 s (bench/results/, issue 57).
#include <string>
#include <vector>

namespace attnreplay {

// `argv`: the whole command line (argv[0] the program); `--gpus N` is taken out of each rank's.
// Throws InputError when a rank cannot be started. When a rank dies of a signal, the others are
// stopped and the exit status says so.
int run_local_ranks(int count, const std::vector<std::string>& argv);

}  // namespace attnreplay
