#pragma once
// Errors in what a user gave us (files, flags) are InputError and name the place: file, call,
// field. Our own broken invariants use ATTNREPLAY_ASSERT and are bugs, never user errors.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>

namespace attnreplay {

class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A call the format being written cannot hold (FlashInfer-Trace has no definition for a sliding
// window): nothing was written for it, and the message says why. Not a damaged input.
class NotRepresentable : public InputError {
 public:
  using InputError::InputError;
};

// "run.h5: call 17: field 'k': expected 4 dims, got 3"
template <typename... Args>
[[noreturn]] void throw_input_error(const std::string& where, fmt::format_string<Args...> what,
                                    Args&&... args) {
  throw InputError(where + ": " + fmt::format(what, std::forward<Args>(args)...));
}

[[noreturn]] void internal_assert_failure(const char* condition, const char* file, int line,
                                          const std::string& message);

}  // namespace attnreplay

#define ATTNREPLAY_ASSERT(condition, message)                                                  \
  do {                                                                                         \
    if (!(condition)) ::attnreplay::internal_assert_failure(#condition, __FILE__, __LINE__, message); \
  } while (false)
