#include "replay/run/prefetch.h"

#include <algorithm>

namespace attnreplay {

std::uint64_t call_bytes(const AttentionCall& call) {
  std::uint64_t bytes = 0;
  for (const auto& [name, tensor] : call.named_tensors()) bytes += tensor->nbytes();
  return bytes;
}

CallPrefetcher::CallPrefetcher(CaptureSource& source, std::vector<std::size_t> positions, std::uint64_t budget_bytes,
                               BytePool::Hooks memory)
    : source_(source), positions_(std::move(positions)), budget_(budget_bytes), memory_(budget_bytes, std::move(memory)),
      reader_([this] { read_ahead(); }) {}

CallPrefetcher::~CallPrefetcher() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  reader_.join();
}

void CallPrefetcher::read_ahead() {
  const BytePoolScope reused(memory_);
  for (std::size_t position : positions_) {
    Slot slot;
    try {
      // The header says how much the call will take before its bytes are read.
      slot.bytes = call_bytes(source_.load(position, /*with_data=*/false));
      {
        std::unique_lock lock(mutex_);
        // Wait for room, unless nothing else is held: a call larger than the budget comes alone.
        changed_.wait(lock, [&] { return stopping_ || held_ + slot.bytes <= budget_ || held_ == 0; });
        if (stopping_) return;
        held_ += slot.bytes;
        peak_ = std::max(peak_, held_);
      }
      slot.call = source_.load(position);
    } catch (...) {
      slot.error = std::current_exception();
    }
    {
      const std::lock_guard lock(mutex_);
      if (stopping_) return;
      ready_.push_back(std::move(slot));
    }
    changed_.notify_all();
  }
}

std::optional<AttentionCall> CallPrefetcher::next() {
  std::unique_lock lock(mutex_);
  held_ -= current_bytes_;  // the caller is done with the call it had
  current_bytes_ = 0;
  changed_.notify_all();
  if (handed_out_ == positions_.size()) return std::nullopt;
  changed_.wait(lock, [&] { return !ready_.empty(); });
  Slot slot = std::move(ready_.front());
  ready_.pop_front();
  ++handed_out_;
  if (slot.error) {
    held_ -= slot.bytes;  // a call that failed to read holds nothing
    changed_.notify_all();
    std::rethrow_exception(slot.error);
  }
  current_bytes_ = slot.bytes;
  return std::move(slot.call);
}

std::uint64_t CallPrefetcher::peak_bytes() const {
  const std::lock_guard lock(mutex_);
  return peak_;
}

}  // namespace attnreplay
