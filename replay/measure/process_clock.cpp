#include "replay/measure/process_clock.h"

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

#include <time.h>
#include <unistd.h>

namespace attnreplay {
namespace {

using Clock = std::chrono::steady_clock;

// Seconds the process had already run when this is called: Linux's start time of the process
// (field 22 of /proc/self/stat, in clock ticks since boot) against the boot clock now. 0 where
// either cannot be read: the clock then starts when the program's statics are made.
double seconds_already_run() {
  std::ifstream stat("/proc/self/stat");
  std::string line;
  if (!std::getline(stat, line)) return 0;
  // The command name (field 2) is in parentheses and may hold spaces: count from the last ')'.
  const auto close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(line.substr(close + 2));
  std::string field;
  for (int number = 3; number < 22 && fields >> field; ++number) {
  }
  unsigned long long start_ticks = 0;
  if (!(fields >> start_ticks)) return 0;
  timespec boot{};
  const long ticks_per_s = sysconf(_SC_CLK_TCK);
  if (ticks_per_s <= 0 || clock_gettime(CLOCK_BOOTTIME, &boot) != 0) return 0;
  const double since = static_cast<double>(boot.tv_sec) + boot.tv_nsec * 1e-9 - static_cast<double>(start_ticks) / ticks_per_s;
  return since > 0 ? since : 0;
}

struct ProcessStart {
  Clock::time_point now = Clock::now();
  double already = seconds_already_run();
};

// Made while the program's statics are (before main), so the libraries' loading is counted.
const ProcessStart process_start;

}  // namespace

double seconds_since_process_start() {
  return process_start.already + std::chrono::duration<double>(Clock::now() - process_start.now).count();
}

}  // namespace attnreplay
