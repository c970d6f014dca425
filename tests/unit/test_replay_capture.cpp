// Replaying a capture (replay/run/replay_capture.cpp): headers decide which calls are wanted, and
// only those are read whole.
#include <catch2/catch_test_macros.hpp>

#include <map>
#include <string>
#include <vector>

#include "formats/capture_source.h"
#include "replay/run/replay_capture.h"

using namespace attnreplay;

namespace {

HostTensor f32(std::vector<std::int64_t> shape, double value) {
  const std::int64_t n = shape[0] * shape[1] * shape[2] * shape[3];
  return HostTensor::from_doubles(DType::float32, std::move(shape), std::vector<double>(static_cast<std::size_t>(n), value));
}

// A capture of small calls that counts what is read: a header, or a call whole.
class CountingSource final : public CaptureSource {
 public:
  explicit CountingSource(std::size_t calls) : calls_(calls) {}
  const std::string& path() const override { return path_; }
  std::string format() const override { return "counting"; }
  std::size_t size() const override { return calls_; }
  const std::vector<std::string>& open_errors() const override { return errors_; }
  AttentionCall load(std::size_t position, bool with_data) override {
    ++(with_data ? whole : headers)[position];
    AttentionCall call;
    call.source = path_;
    call.call_index = static_cast<std::int64_t>(position) * 10;  // indices need not be positions
    call.q = f32({1, 1, 4, 8}, 0.5);
    call.k = f32({1, 1, 6, 8}, 0.25);
    call.v = f32({1, 1, 6, 8}, 1.0);
    if (!with_data) {
      for (HostTensor* t : {&call.q, &call.k, &call.v}) t->bytes.reset();
    }
    return call;
  }
  std::map<std::size_t, int> headers, whole;

 private:
  std::string path_ = "counting.pt";
  std::size_t calls_;
  std::vector<std::string> errors_;
};

}  // namespace

TEST_CASE("replay_capture: only the calls --calls picks are read whole; the rest only their headers") {
  CountingSource source(5);
  ReplayOptions options;
  options.kernels = {"torch-math"};
  options.reference_device = "cpu";
  options.stopping.min_samples = 2;
  options.stopping.min_time_s = 0;
  Report report;
  replay_capture(source, [](std::int64_t index) { return index == 10 || index == 30; }, options, report);

  REQUIRE(report.calls.size() == 2);
  CHECK(report.calls[0].call_index == 10);
  CHECK(report.calls[1].call_index == 30);
  CHECK(source.whole == std::map<std::size_t, int>{{1, 1}, {3, 1}});  // each read once, with its data
  CHECK(source.headers.size() == 5);                                  // every header, to pick
  CHECK(report.input_errors.empty());
}
