#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <chrono>
#include <thread>

#include "replay/measure/nvml_monitor.h"

using namespace attnreplay;
using Catch::Matchers::ContainsSubstring;

TEST_CASE("nvml monitor: reads clock, power and the power cap in the background between start and stop") {
  NvmlMonitorResult made = make_nvml_monitor("0000:00:06.0", ATTNREPLAY_FAKE_NVML);
  REQUIRE(made.monitor);
  CHECK(made.description == "nvml");
  made.monitor->start();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const ClockReadings readings = made.monitor->stop();
  // One reading every 5 ms: about 20 in 100 ms, fewer on a busy machine.
  REQUIRE(readings.sm_mhz.size() >= 4);
  CHECK(readings.power_w.size() == readings.sm_mhz.size());
  for (double mhz : readings.sm_mhz) CHECK(mhz == 1605.0);
  for (double watts : readings.power_w) CHECK(watts == 700.0);
  CHECK(readings.power_capped == static_cast<int>(readings.sm_mhz.size()));

  // A second window starts empty: stopped at once, it holds one reading or two, not the first's.
  made.monitor->start();
  const std::size_t second = made.monitor->stop().sm_mhz.size();
  CHECK(second >= 1);
  CHECK(second < readings.sm_mhz.size());
  CHECK(made.monitor->stop().sm_mhz.empty());  // stopping again gives nothing
}

TEST_CASE("nvml monitor: a bus id NVML does not know falls back to its only GPU") {
  NvmlMonitorResult made = make_nvml_monitor("0000:41:00.0", ATTNREPLAY_FAKE_NVML);
  REQUIRE(made.monitor);
  made.monitor->start();
  CHECK(made.monitor->stop().sm_mhz.size() >= 1);
}

TEST_CASE("nvml monitor: without the driver's library there is no monitor, and the reason says so") {
  const NvmlMonitorResult made = make_nvml_monitor("0000:00:06.0", "libattnreplay-no-such-nvml.so.1");
  CHECK_FALSE(made.monitor);
  CHECK_THAT(made.description, ContainsSubstring("unavailable: libattnreplay-no-such-nvml.so.1 not loadable"));
}
