#pragma once
// Where an attention call came from: the Python line that called into torch and the object whose
// method made the call (an attention module or processor), or the C++ frame. The caller object
// is what tells layers apart: every layer's attention runs the same line of code.
#include <cstdint>
#include <string>
#include <unordered_map>

namespace attnreplay::capture {

struct CallSite {
  std::string location;      // "models/bert.py:318 in forward", or "app+0x1234 (run_model)"
  std::string caller_class;  // Python class of the caller object, e.g. "BertSdpaSelfAttention"
  std::uintptr_t caller_id = 0;  // identity of that object (Python) or of the location (C++)
};

// Cheap when Python is absent: resolved once through the process's own symbols.
CallSite current_call_site();

// Layer within a step and the step, from the order in which caller objects appear: the first
// caller seen starts every step, and a layer is a caller's rank of first appearance. With a fixed
// number of calls per step (ATTNCAP_CALLS_PER_STEP) that number decides instead.
class PositionTracker {
 public:
  explicit PositionTracker(std::int64_t calls_per_step) : calls_per_step_(calls_per_step) {}
  struct Position {
    std::int64_t step = 0;
    std::int64_t layer = 0;
  };
  Position next(std::uintptr_t caller_id);

 private:
  std::int64_t calls_per_step_;
  std::int64_t calls_ = 0;
  std::int64_t step_ = 0;
  std::uintptr_t first_caller_ = 0;
  std::unordered_map<std::uintptr_t, std::int64_t> layer_of_;
};

}  // namespace attnreplay::capture
