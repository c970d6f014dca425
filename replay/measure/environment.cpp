#include "replay/measure/environment.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <hdf5.h>
#include <sys/utsname.h>
#include <torch/version.h>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "replay/measure/gpu.h"

namespace attnreplay {

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
  describe_cuda_device(env);
  if (!v.count("gpu")) v["gpu"] = "none";
  return env;
}

namespace {

// cuDNN and CUDA runtime versions as libtorch reports them.
void describe_torch_cuda(Environment& environment) {
  auto& hooks = at::detail::getCUDAHooks();
  if (!hooks.hasCUDA()) return;
  const long cudnn = hooks.versionCuDNN();
  environment.values["cudnn"] = fmt::format("{}.{}.{}", cudnn / 10000, cudnn / 100 % 100, cudnn % 100);
  const long runtime = hooks.versionCUDART();
  environment.values["torch_cuda_runtime"] = fmt::format("{}.{}", runtime / 1000, runtime % 1000 / 10);
}

std::string now_utc() {
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(now));
}

}  // namespace

void describe_run(Report& report, const std::vector<std::string>& argv) {
  report.tool_version = tool_version();
  report.argv = argv;
  report.started_utc = now_utc();
  report.environment = describe_environment();
  if (gpu_present()) describe_torch_cuda(report.environment);
}

}  // namespace attnreplay
