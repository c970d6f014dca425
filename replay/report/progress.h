#pragma once
// Where a long replay or audit stands, for a person at a terminal: calls done of the total, the
// kernel at work, elapsed and remaining time, on one line of stderr that is redrawn in place.
// Whoever creates one decides whether anyone watches (a terminal, no -q); nothing else prints it.
#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>

namespace attnreplay {

class ReplayProgress {
 public:
  explicit ReplayProgress(std::ostream& out) : out_(out), start_(std::chrono::steady_clock::now()) {}
  void add_calls(std::int64_t count) { total_ += count; }
  void kernel_started(const std::string& kernel);
  void call_finished();
  // Erases the line, so that a table printed next starts clean; the next update redraws it.
  void clear();

 private:
  void draw();
  std::ostream& out_;
  std::chrono::steady_clock::time_point start_;
  std::int64_t total_ = 0, done_ = 0;
  std::string kernel_;
  bool drawn_ = false;
};

// "1h02m", "3m10s", "42s".
std::string format_duration(double seconds);

}  // namespace attnreplay
