#pragma once
// Memory for tensors' bytes, reused. A reader that loads call after call of the same shapes gets
// buffers whose pages are already mapped (and page-locked for the GPU, when the pool's owner pins
// them) instead of fresh memory that the system must map, zero and lock again for every call: on
// the H100 machine that was most of the time of reading a Flux-sized call from the page cache
// (bench/results/2026-11-24-h100-scale/README.md).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace attnreplay {

using Bytes = std::vector<std::byte>;

class BytePool {
 public:
  // Called once for each buffer the pool makes, and before it frees one (to pin and unpin it).
  struct Hooks {
    std::function<void(Bytes&)> on_new, on_drop;
  };
  // Keeps released buffers for reuse while they and those taken come to at most `keep_bytes`.
  explicit BytePool(std::uint64_t keep_bytes, Hooks hooks = {});
  // Buffers still taken are freed when released.
  ~BytePool();
  BytePool(const BytePool&) = delete;
  BytePool& operator=(const BytePool&) = delete;

  // `size` bytes, their contents unspecified (a new buffer is zeroed); back to the pool once the
  // last reference to it goes. Any thread may take and release.
  std::shared_ptr<Bytes> take(std::size_t size);
  // How many buffers the pool has made: reuse keeps this flat.
  std::uint64_t buffers_made() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// While one lives, allocate_bytes() on this thread takes from `pool`.
class BytePoolScope {
 public:
  explicit BytePoolScope(BytePool& pool);
  ~BytePoolScope();
  BytePoolScope(const BytePoolScope&) = delete;
  BytePoolScope& operator=(const BytePoolScope&) = delete;

 private:
  BytePool* previous_;
};

// Memory for a tensor's bytes that the caller overwrites whole: from this thread's pool where a
// BytePoolScope lives (contents unspecified), else new and zeroed.
std::shared_ptr<Bytes> allocate_bytes(std::size_t size);

}  // namespace attnreplay
