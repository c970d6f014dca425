#include "formats/byte_pool.h"

#include <algorithm>
#include <list>
#include <mutex>

namespace attnreplay {

struct BytePool::State {
  std::mutex mutex;
  std::uint64_t keep_bytes = 0;
  Hooks hooks;
  std::list<std::unique_ptr<Bytes>> released;  // least recently released first
  std::uint64_t released_bytes = 0, taken_bytes = 0;
  std::uint64_t made = 0;
  bool closed = false;

  void drop(std::unique_ptr<Bytes> bytes) {
    if (hooks.on_drop) hooks.on_drop(*bytes);
  }
  // Frees the least recently released until `incoming` more bytes fit beside those taken; under
  // the lock.
  void make_room(std::uint64_t incoming) {
    while (!released.empty() && taken_bytes + released_bytes + incoming > keep_bytes) {
      released_bytes -= released.front()->size();
      drop(std::move(released.front()));
      released.pop_front();
    }
  }
};

BytePool::BytePool(std::uint64_t keep_bytes, Hooks hooks) : state_(std::make_shared<State>()) {
  state_->keep_bytes = keep_bytes;
  state_->hooks = std::move(hooks);
}

BytePool::~BytePool() {
  const std::lock_guard lock(state_->mutex);
  state_->closed = true;
  state_->make_room(state_->keep_bytes + 1);  // all of them
}

std::shared_ptr<Bytes> BytePool::take(std::size_t size) {
  std::unique_ptr<Bytes> bytes;
  {
    const std::lock_guard lock(state_->mutex);
    auto& released = state_->released;
    const auto found = std::find_if(released.rbegin(), released.rend(), [&](const auto& b) { return b->size() == size; });
    if (found != released.rend()) {
      bytes = std::move(*found);
      released.erase(std::next(found).base());
      state_->released_bytes -= size;
    } else {
      state_->make_room(size);
      ++state_->made;
    }
    state_->taken_bytes += size;
  }
  if (!bytes) {
    bytes = std::make_unique<Bytes>(size);
    if (state_->hooks.on_new) state_->hooks.on_new(*bytes);
  }
  // The deleter holds the state, so a buffer released after the pool is gone is still unpinned.
  return std::shared_ptr<Bytes>(bytes.release(), [state = state_](Bytes* raw) {
    std::unique_ptr<Bytes> back(raw);
    const std::lock_guard lock(state->mutex);
    state->taken_bytes -= back->size();
    if (state->closed || state->taken_bytes + state->released_bytes + back->size() > state->keep_bytes) {
      state->drop(std::move(back));
      return;
    }
    state->released_bytes += back->size();
    state->released.push_back(std::move(back));
  });
}

std::uint64_t BytePool::buffers_made() const {
  const std::lock_guard lock(state_->mutex);
  return state_->made;
}

namespace {
thread_local BytePool* current_pool = nullptr;
}  // namespace

BytePoolScope::BytePoolScope(BytePool& pool) : previous_(current_pool) { current_pool = &pool; }
BytePoolScope::~BytePoolScope() { current_pool = previous_; }

std::shared_ptr<Bytes> allocate_bytes(std::size_t size) {
  return current_pool ? current_pool->take(size) : std::make_shared<Bytes>(size);
}

}  // namespace attnreplay
