#include "replay/run/prefetch.h"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "formats/errors.h"

namespace attnreplay {
namespace {

// Calls of `seq` rows each (Q, K, V of 1x1xseqx16 float32: seq * 192 bytes), counting the bytes of
// tensors alive: an account of the memory held that does not rely on the prefetcher's own.
class CountingSource final : public CaptureSource {
 public:
  CountingSource(std::vector<std::int64_t> seqs, std::size_t bad_position = SIZE_MAX)
      : seqs_(std::move(seqs)), bad_(bad_position) {}
  const std::string& path() const override { return path_; }
  std::string format() const override { return "counting"; }
  std::size_t size() const override { return seqs_.size(); }
  const std::vector<std::string>& open_errors() const override { return errors_; }
  AttentionCall load(std::size_t position, bool with_data) override {
    if (position == bad_ && with_data) throw InputError(fmt::format("counting: call {}: field 'q': unreadable", position));
    AttentionCall call;
    call.call_index = static_cast<std::int64_t>(position);
    for (HostTensor* t : {&call.q, &call.k, &call.v}) {
      t->dtype = DType::float32;
      t->shape = {1, 1, seqs_[position], 16};
      if (!with_data) continue;
      const std::size_t bytes = t->nbytes();
      live_ += bytes;
      peak_live_ = std::max(peak_live_.load(), live_.load());
      t->bytes = std::shared_ptr<const std::vector<std::byte>>(new std::vector<std::byte>(bytes),
                                                               [this, bytes](const std::vector<std::byte>* b) {
                                                                 live_ -= bytes;
                                                                 delete b;
                                                               });
    }
    return call;
  }
  std::size_t peak_live() const { return peak_live_; }

 private:
  std::vector<std::int64_t> seqs_;
  std::size_t bad_;
  std::string path_ = "counting";
  std::vector<std::string> errors_;
  std::atomic<std::size_t> live_{0}, peak_live_{0};
};

constexpr std::uint64_t kRowBytes = 3 * 16 * 4;

TEST_CASE("CallPrefetcher: every call in order, within the byte budget, the one replayed counted in") {
  std::vector<std::int64_t> seqs;
  for (int i = 0; i < 40; ++i) seqs.push_back(100 + 10 * (i % 7));
  CountingSource source(seqs);
  const std::uint64_t budget = 700 * kRowBytes;  // room for four to six calls
  {
    CallPrefetcher calls(source, {0, 1, 2, 5, 8, 9, 10, 20, 21, 22, 23, 39}, budget);
    std::vector<std::int64_t> seen;
    while (auto call = calls.next()) {
      seen.push_back(call->call_index);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the reader gets ahead
    }
    CHECK(seen == std::vector<std::int64_t>{0, 1, 2, 5, 8, 9, 10, 20, 21, 22, 23, 39});
    CHECK(calls.peak_bytes() <= budget);
    CHECK(calls.peak_bytes() >= 3 * 100 * kRowBytes);  // it did read ahead
    CHECK_FALSE(calls.next());
  }
  CHECK(source.peak_live() <= budget);
}

TEST_CASE("CallPrefetcher: a call larger than the budget is read alone; a bad call throws in its turn") {
  CountingSource source({100, 1000, 100, 100}, /*bad_position=*/2);
  CallPrefetcher calls(source, {0, 1, 2, 3}, 300 * kRowBytes);
  CHECK(calls.next()->call_index == 0);
  CHECK(calls.next()->call_index == 1);
  CHECK_THROWS_WITH(calls.next(), Catch::Matchers::ContainsSubstring("call 2: field 'q': unreadable"));
  CHECK(calls.next()->call_index == 3);
  CHECK_FALSE(calls.next());
  CHECK(calls.peak_bytes() == 1000 * kRowBytes);
  CHECK(source.peak_live() == 1000 * kRowBytes);
}

TEST_CASE("CallPrefetcher: destroyed before the end, the reader stops") {
  CountingSource source(std::vector<std::int64_t>(50, 100));
  {
    CallPrefetcher calls(source, std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 200 * kRowBytes);
    CHECK(calls.next()->call_index == 0);
  }
  SUCCEED("joined");
}

}  // namespace
}  // namespace attnreplay
