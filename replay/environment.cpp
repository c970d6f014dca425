#include "replay/environment.h"

#ifdef ATTNREPLAY_HAVE_CUDA
#include "replay/cuda_timing.h"
#endif

#include <hdf5.h>
#include <sys/utsname.h>
#include <torch/version.h>

#include <fmt/format.h>

#include <fstream>
#include <thread>

namespace attnreplay {

std::string tool_version() { return fmt::format("{} (git {})", ATTNREPLAY_VERSION, ATTNREPLAY_GIT_SHA); }

Environment describe_environment() {
  Environment env;
  auto& v = env.values;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      v["cpu"] = line.substr(line.find(':') + 2);
      break;
    }
  }
  v["logical_cores"] = std::to_string(std::thread::hardware_concurrency());
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    if (line.rfind("MemTotal", 0) == 0) {
      v["memory"] = line.substr(line.find_first_not_of(" ", 9));
      break;
    }
  }
  utsname name{};
  if (uname(&name) == 0) v["os"] = fmt::format("{} {} {}", name.sysname, name.release, name.machine);
  v["compiler"] = __VERSION__;
#ifdef NDEBUG
  v["build"] = "release";
#else
  v["build"] = "debug (timings are not representative)";
#endif
  v["torch"] = TORCH_VERSION;
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  v["hdf5"] = fmt::format("{}.{}.{}", major, minor, release);
#ifdef ATTNREPLAY_HAVE_CUDA
  describe_cuda_device(env);
#endif
  if (!v.count("gpu")) v["gpu"] = "none";
  return env;
}

}  // namespace attnreplay
