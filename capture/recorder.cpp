#include "capture/recorder.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <unistd.h>

#include <cstdio>

#include "formats/hdf5_format.h"
#include "formats/pt_format.h"
#include "formats/safetensors_format.h"

namespace attnreplay::capture {

namespace {

// One file per call (.pt or .safetensors) in a folder of its own: each file appears whole
// (written, then renamed), so that every call is kept however the job ends.
class CallFolderCapture final : public CaptureWriter {
 public:
  CallFolderCapture(std::string folder, OutputFormat format) : folder_(std::move(folder)), format_(format) {}
  void append(const AttentionCall& call) override {
    if (format_ == OutputFormat::pt) {
      write_pt_call(call, fmt::format("{}/call_{:06d}.pt", folder_, call.call_index));
    } else {
      write_safetensors_calls({&call, 1}, fmt::format("{}/call_{:06d}.safetensors", folder_, call.call_index),
                              "attncap (attnreplay capture)");
    }
  }
  void close() override {}

 private:
  std::string folder_;
  OutputFormat format_;
};

}  // namespace

Recorder::Recorder(const CaptureConfig& config, std::string path) : config_(config), path_(std::move(path)) {
  if (config_.format == OutputFormat::hdf5) {
    Hdf5WriterOptions options;
    options.producer = "attncap (attnreplay capture)";
    options.exclusive = true;
    writer_ = std::make_unique<Hdf5CaptureWriter>(path_, options);
  } else {
    std::filesystem::create_directories(path_);
    writer_ = std::make_unique<CallFolderCapture>(path_, config_.format);
  }
  copier_ = std::thread([this] { copy_loop(); });
  writer_thread_ = std::thread([this] { write_loop(); });
}

Recorder::~Recorder() { shutdown(); }

void Recorder::submit(AttentionCall call, std::uint64_t bytes, Finish finish) {
  if (!accepting()) return;
  if (config_.max_bytes && stats_.bytes.load() + bytes > config_.max_bytes) {
    ++stats_.dropped_budget;
    return;
  }
  std::unique_lock lock(mutex_);
  // A call larger than the whole budget still goes through once the queue is empty.
  auto has_room = [&] { return queued_bytes_ == 0 || queued_bytes_ + bytes <= config_.queue_bytes || stopping_; };
  if (!has_room()) {
    if (config_.when_full == WhenFull::drop) {
      ++stats_.dropped_full;
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    has_room_.wait(lock, has_room);
    stats_.stalled_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  }
  if (stopping_) return;
  stats_.bytes += bytes;
  queued_bytes_ += bytes;
  to_copy_.push_back({std::move(call), bytes, std::move(finish)});
  has_copies_.notify_one();
}

void Recorder::copy_loop() {
  while (true) {
    Work item;
    {
      std::unique_lock lock(mutex_);
      has_copies_.wait(lock, [&] { return !to_copy_.empty() || stopping_; });
      if (to_copy_.empty()) {
        copier_done_ = true;
        has_writes_.notify_all();
        return;
      }
      item = std::move(to_copy_.front());
      to_copy_.pop_front();
    }
    if (item.finish) {
      try {
        item.finish(item.call);
      } catch (const std::exception& error) {
        // One call's copy failed (an unexpected device, say): skip it, keep capturing.
        ++stats_.failed;
        std::call_once(copy_failure_reported_, [&] {
          std::fprintf(stderr, "[attncap] a call was not captured: %s\n", error.what());
        });
        std::lock_guard lock(mutex_);
        queued_bytes_ -= item.bytes;
        has_room_.notify_all();
        continue;
      }
      item.finish = nullptr;
    }
    std::lock_guard lock(mutex_);
    to_write_.push_back(std::move(item));
    has_writes_.notify_one();
  }
}

void Recorder::write_loop() {
  while (true) {
    Work item;
    {
      std::unique_lock lock(mutex_);
      has_writes_.wait(lock, [&] { return !to_write_.empty() || copier_done_; });
      if (to_write_.empty()) return;
      item = std::move(to_write_.front());
      to_write_.pop_front();
    }
    if (writer_failed_) {
      ++stats_.failed;  // queued before the writer failed; nothing more is written
    } else if (writer_) {
      try {
        writer_->append(item.call);
        ++stats_.captured;
      } catch (const std::exception& error) {
        // Disk full, folder gone: say so once, keep what is written, stop capturing.
        ++stats_.failed;
        writer_failed_ = true;
        if (accepting_.exchange(false)) {
          std::fprintf(stderr, "[attncap] capture stopped: %s; the %lld calls written so far are kept in %s\n",
                       error.what(), static_cast<long long>(stats_.captured.load()), path_.c_str());
        }
      }
    }
    {
      std::lock_guard lock(mutex_);
      queued_bytes_ -= item.bytes;
    }
    has_room_.notify_all();
  }
}

void Recorder::shutdown() {
  if (shut_down_.exchange(true)) return;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  accepting_ = false;
  has_copies_.notify_all();
  has_room_.notify_all();
  if (copier_.joinable()) copier_.join();
  if (writer_thread_.joinable()) writer_thread_.join();
  try {
    if (writer_) writer_->close();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "[attncap] closing %s failed: %s\n", path_.c_str(), error.what());
  }
  if (!config_.quiet) {
    std::fprintf(stderr,
                 "[attncap] pid %d: %lld attention calls seen, %lld captured, %lld dropped (queue full), "
                 "%lld over budget, %lld failed; %.1f MB of tensors, %.3f s stalled; %s\n",
                 static_cast<int>(getpid()), static_cast<long long>(stats_.seen.load()),
                 static_cast<long long>(stats_.captured.load()), static_cast<long long>(stats_.dropped_full.load()),
                 static_cast<long long>(stats_.dropped_budget.load()), static_cast<long long>(stats_.failed.load()),
                 static_cast<double>(stats_.bytes.load()) / 1e6, static_cast<double>(stats_.stalled_ns.load()) / 1e9,
                 path_.c_str());
  }
}

void Recorder::abandon_in_child() {
  accepting_ = false;
  shut_down_ = true;
  // The threads and the open file belong to the parent; release without joining or closing.
  copier_.detach();
  writer_thread_.detach();
  (void)writer_.release();
}

}  // namespace attnreplay::capture
