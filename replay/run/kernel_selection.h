#pragma once
// Which registered kernels a --kernels list names ("all", "cpu" and "gpu" are groups).
#include <string>
#include <vector>

namespace attnreplay {

class Kernel;

// Resolves kernel names, in order and each once, throwing InputError for unknown names. On a GPU
// machine "all" means its GPU kernels: the CPU ones (emulations, torch's CPU backends) would take
// minutes on GPU-sized calls; "cpu" and "gpu" name each group. The references are in no group: they
// are computed for every call, and timed only when named.
std::vector<const Kernel*> select_kernels(const std::vector<std::string>& names);

}  // namespace attnreplay
