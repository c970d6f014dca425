#pragma once
// Takes finished calls from the model's threads and writes them in the background, within a
// bounded memory budget: a copier thread finishes each call's tensor copies (device to host),
// so that GPU clones are let go quickly, and a writer thread writes calls to the file. Never
// throws: failures are reported once on stderr and counted.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "capture/config.h"
#include "formats/capture_source.h"

namespace attnreplay::capture {

struct CaptureStats {
  std::atomic<std::int64_t> seen{0};            // matched calls, selected or not
  std::atomic<std::int64_t> captured{0};        // written to the file
  std::atomic<std::int64_t> dropped_full{0};    // queue full under ATTNCAP_WHEN_FULL=drop
  std::atomic<std::int64_t> dropped_budget{0};  // over ATTNCAP_MAX_BYTES or ATTNCAP_MAX_CALLS
  std::atomic<std::int64_t> failed{0};          // could not be copied or written
  std::atomic<std::uint64_t> bytes{0};          // tensor bytes handed to the writer
  std::atomic<std::int64_t> stalled_ns{0};      // time model threads waited for queue room
};

class Recorder {
 public:
  // Opens the output (so an unwritable folder is reported at start). Throws on failure.
  Recorder(const CaptureConfig& config, std::string path);
  ~Recorder();
  // Queues a call of `bytes` tensor bytes whose tensors `finish` fills in on the writer thread
  // (waiting for GPU copies there, not on the model's thread). May wait for room
  // (ATTNCAP_WHEN_FULL=wait) or drop the call.
  using Finish = std::function<void(AttentionCall&)>;
  void submit(AttentionCall call, std::uint64_t bytes, Finish finish);
  // Writes what is queued, closes the file, prints the summary. Idempotent.
  void shutdown();
  // After fork(): the writer thread does not exist in the child.
  void abandon_in_child();
  bool accepting() const { return accepting_.load(std::memory_order_relaxed); }
  CaptureStats& stats() { return stats_; }
  const std::string& path() const { return path_; }

 private:
  void copy_loop();
  void write_loop();

  CaptureConfig config_;
  std::string path_;
  std::unique_ptr<CaptureWriter> writer_;
  std::mutex mutex_;
  std::condition_variable has_copies_, has_writes_, has_room_;
  struct Work {
    AttentionCall call;
    std::uint64_t bytes = 0;
    Finish finish;
  };
  std::deque<Work> to_copy_, to_write_;  // calls whose copies are pending; calls ready to write
  std::uint64_t queued_bytes_ = 0;
  bool stopping_ = false;
  std::atomic<bool> accepting_{true};
  bool writer_failed_ = false;  // written by the writer thread only
  std::atomic<bool> shut_down_{false};
  bool copier_done_ = false;
  std::thread copier_, writer_thread_;
  std::once_flag copy_failure_reported_;
  CaptureStats stats_;
};

}  // namespace attnreplay::capture
