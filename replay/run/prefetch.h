#pragma once
// Reading ahead. While the current call is measured, a thread reads and decodes the next calls of
// a capture, holding at most a byte budget of calls (the one being replayed counted in), so that
// a large capture's replay waits on the disk only where the disk is slower than the kernels.
// The thread runs no GPU work and no torch: uploads happen on the measuring thread, between
// timings, never during one. It reads into reused memory (formats/byte_pool.h), which the caller
// may have pinned for those uploads.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "formats/byte_pool.h"
#include "formats/capture_source.h"

namespace attnreplay {

class CallPrefetcher {
 public:
  // Reads `positions` of `source` in order into buffers of a pool that keeps up to the budget for
  // reuse, made and freed through `memory`. No one else may use `source` until this is destroyed.
  CallPrefetcher(CaptureSource& source, std::vector<std::size_t> positions, std::uint64_t budget_bytes,
                 BytePool::Hooks memory = {});
  ~CallPrefetcher();
  CallPrefetcher(const CallPrefetcher&) = delete;
  CallPrefetcher& operator=(const CallPrefetcher&) = delete;

  // The next call, in order; its InputError is thrown here, and the calls after it still come.
  // Returns nullopt after the last. The call returned before is released.
  std::optional<AttentionCall> next();

  // The most bytes of calls held at once (read ahead and being replayed): within the budget,
  // unless one call alone is larger, which is then read alone.
  std::uint64_t peak_bytes() const;

 private:
  struct Slot {
    std::optional<AttentionCall> call;
    std::exception_ptr error;
    std::uint64_t bytes = 0;
  };
  void read_ahead();

  CaptureSource& source_;
  std::vector<std::size_t> positions_;
  std::uint64_t budget_;
  BytePool memory_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Slot> ready_;
  std::uint64_t held_ = 0, peak_ = 0;
  std::uint64_t current_bytes_ = 0;  // the call last returned by next()
  std::size_t handed_out_ = 0;
  bool stopping_ = false;
  std::thread reader_;
};

// The bytes a call's tensors take in memory.
std::uint64_t call_bytes(const AttentionCall& call);

}  // namespace attnreplay
