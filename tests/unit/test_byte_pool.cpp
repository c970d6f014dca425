// BytePool: buffers come back for reuse, memory stays within what the pool may keep, and every
// buffer the hooks saw made is seen freed, including those released after the pool is gone.
#include "formats/byte_pool.h"

#include <catch2/catch_test_macros.hpp>

#include <set>
#include <thread>

namespace attnreplay {
namespace {

struct Ledger {
  std::set<const std::byte*> alive;
  std::uint64_t alive_bytes = 0, peak_bytes = 0;
  BytePool::Hooks hooks() {
    return {[this](Bytes& b) {
              alive.insert(b.data());
              alive_bytes += b.size();
              peak_bytes = std::max(peak_bytes, alive_bytes);
            },
            [this](Bytes& b) {
              REQUIRE(alive.erase(b.data()) == 1);
              alive_bytes -= b.size();
            }};
  }
};

TEST_CASE("BytePool reuses a released buffer of the same size instead of making one") {
  Ledger ledger;
  BytePool pool(1000, ledger.hooks());
  const std::byte* first = nullptr;
  for (int round = 0; round < 10; ++round) {
    auto bytes = pool.take(300);
    REQUIRE(bytes->size() == 300);
    if (round == 0) first = bytes->data();
    CHECK(bytes->data() == first);
  }
  CHECK(pool.buffers_made() == 1);
  auto other = pool.take(200);  // another size: a new buffer
  CHECK(pool.buffers_made() == 2);
}

TEST_CASE("BytePool holds taken and released buffers within what it may keep") {
  Ledger ledger;
  {
    BytePool pool(1000, ledger.hooks());
    std::vector<std::shared_ptr<Bytes>> held;
    for (int i = 0; i < 30; ++i) {
      held.push_back(pool.take(100 + 50 * (i % 5)));  // sizes 100..300
      if (held.size() > 3) held.erase(held.begin());  // at most 3 x 300 taken at once
    }
    CHECK(ledger.peak_bytes <= 1000);
    // One buffer larger than the pool keeps is still given, and freed on release.
    { auto big = pool.take(5000); }
    CHECK(ledger.alive_bytes <= 1000);
  }
  CHECK(ledger.alive.empty());
}

TEST_CASE("BytePool: a buffer released after the pool is gone, on another thread, is freed") {
  Ledger ledger;
  std::shared_ptr<Bytes> kept;
  {
    BytePool pool(1000, ledger.hooks());
    kept = pool.take(400);
  }
  CHECK(ledger.alive.size() == 1);
  std::thread([moved = std::move(kept)]() mutable { moved.reset(); }).join();
  CHECK(ledger.alive.empty());
}

TEST_CASE("allocate_bytes takes from the pool of this thread's scope only") {
  BytePool pool(1000);
  {
    const BytePoolScope scope(pool);
    auto a = allocate_bytes(100);
    std::thread([] { CHECK(allocate_bytes(50)->size() == 50); }).join();  // another thread: fresh memory
    CHECK(pool.buffers_made() == 1);
  }
  auto outside = allocate_bytes(100);
  CHECK(pool.buffers_made() == 1);
  CHECK(outside->size() == 100);
}

}  // namespace
}  // namespace attnreplay
