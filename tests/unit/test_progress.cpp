#include "replay/report/progress.h"

#include <catch2/catch_test_macros.hpp>

#include <sstream>

namespace attnreplay {
namespace {

TEST_CASE("format_duration") {
  CHECK(format_duration(0.4) == "0s");
  CHECK(format_duration(42) == "42s");
  CHECK(format_duration(190) == "3m10s");
  CHECK(format_duration(3720) == "1h02m");
}

TEST_CASE("ReplayProgress draws one line in place and erases it") {
  std::ostringstream out;
  ReplayProgress progress(out);
  progress.add_calls(4);
  progress.kernel_started("torch-math");
  CHECK(out.str().rfind("\r\033[K0 of 4 calls · torch-math · ", 0) == 0);
  CHECK(out.str().find("left") == std::string::npos);  // nothing done yet: no estimate
  out.str("");
  progress.call_finished();
  CHECK(out.str().rfind("\r\033[K1 of 4 calls · ", 0) == 0);
  CHECK(out.str().find("left") != std::string::npos);
  out.str("");
  progress.clear();
  CHECK(out.str() == "\r\033[K");
  out.str("");
  progress.clear();  // nothing drawn since: nothing to erase
  CHECK(out.str().empty());
}

}  // namespace
}  // namespace attnreplay
