#include "replay/run/local_ranks.h"

#include <fmt/format.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <ctime>
#include <iostream>
#include <map>

#include "formats/errors.h"
#include "replay/run/sharding.h"

extern char** environ;

namespace attnreplay {
namespace {

// The rank's command line: argv without --gpus and its value, with --shard RANK/COUNT.
std::vector<std::string> rank_arguments(const std::vector<std::string>& argv, int rank, int count) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--gpus") {
      ++i;
      continue;
    }
    if (argv[i].rfind("--gpus=", 0) == 0) continue;
    out.push_back(argv[i]);
  }
  out.push_back(fmt::format("--shard={}/{}", rank, count));
  return out;
}

// The process's environment with LOCAL_RANK set to `rank` (and any launcher's variables out: this
// process is the launcher).
std::vector<std::string> rank_environment(int rank, const std::string& launch_id) {
  std::vector<std::string> out;
  for (char** entry = environ; *entry; ++entry) {
    const std::string variable = *entry;
    if (variable.rfind("LOCAL_RANK=", 0) == 0 || variable.rfind(fmt::format("{}=", kGpusLaunchVariable), 0) == 0) continue;
    out.push_back(variable);
  }
  out.push_back(fmt::format("LOCAL_RANK={}", rank));
  // The parts of this launch, and no earlier one's, are joined (replay/run/merge.h).
  out.push_back(fmt::format("{}={}", kGpusLaunchVariable, launch_id));
  return out;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

int run_local_ranks(int count, const std::vector<std::string>& argv) {
  const std::string launch_id = fmt::format("pid {} at {}", getpid(), static_cast<long long>(time(nullptr)));
  std::map<pid_t, int> ranks;
  const auto stop_all = [&ranks] {
    for (const auto& [pid, rank] : ranks) kill(pid, SIGTERM);
  };
  for (int rank = 0; rank < count; ++rank) {
    std::vector<std::string> arguments = rank_arguments(argv, rank, count);
    std::vector<std::string> environment = rank_environment(rank, launch_id);
    std::vector<char*> arguments_p = pointers(arguments), environment_p = pointers(environment);
    pid_t pid = 0;
    // /proc/self/exe: this very binary, whatever argv[0] and PATH say.
    const int error = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, arguments_p.data(), environment_p.data());
    if (error != 0) {
      stop_all();
      throw InputError(fmt::format("--gpus: could not start rank {}: {}", rank, std::strerror(error)));
    }
    ranks[pid] = rank;
  }
  int rank0_status = 1, worst = 0;
  while (!ranks.empty()) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) break;
    const auto found = ranks.find(pid);
    if (found == ranks.end()) continue;
    const int rank = found->second;
    ranks.erase(found);
    if (WIFSIGNALED(status)) {
      // Rank 0 would wait for a part that never comes.
      std::cerr << fmt::format("error: --gpus: rank {} died of signal {} ({}); stopping the other ranks\n", rank,
                               WTERMSIG(status), strsignal(WTERMSIG(status)));
      stop_all();
      worst = 1;
      continue;
    }
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (rank == 0) rank0_status = code;
    worst = std::max(worst, code);
  }
  return rank0_status != 0 ? rank0_status : worst;
}

}  // namespace attnreplay
