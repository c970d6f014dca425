#include "replay/report/progress.h"

#include <fmt/format.h>

#include <cmath>

namespace attnreplay {

std::string format_duration(double seconds) {
  const auto s = static_cast<std::int64_t>(std::llround(seconds));
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, s % 3600 / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

void ReplayProgress::kernel_started(const std::string& kernel) {
  kernel_ = kernel;
  draw();
}

void ReplayProgress::call_finished() {
  ++done_;
  kernel_.clear();
  draw();
}

void ReplayProgress::clear() {
  if (drawn_) out_ << "\r\033[K" << std::flush;
  drawn_ = false;
}

void ReplayProgress::draw() {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string line = total_ > 0 ? fmt::format("{} of {} calls", done_, total_) : std::string("generated call");
  if (!kernel_.empty()) line += " · " + kernel_;
  line += " · " + format_duration(elapsed) + " elapsed";
  // From the calls done so far: calls of one shape after the first are judged, not timed, so the
  // estimate falls as a capture goes on.
  if (done_ > 0 && total_ > done_) line += " · ~" + format_duration(elapsed / done_ * (total_ - done_)) + " left";
  out_ << "\r\033[K" << line << std::flush;
  drawn_ = true;
}

}  // namespace attnreplay
