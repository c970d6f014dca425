#include "replay/run/replay_capture.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <memory>

#include <unistd.h>

#include "formats/errors.h"
#include "kernels/kernel.h"
#include "kernels/reference.h"
#include "kernels/torch_inputs.h"
#include "replay/measure/process_clock.h"
#include "replay/run/kernel_selection.h"
#include "replay/run/prefetch.h"
#include "replay/run/replay_call.h"
#include "replay/run/rerun.h"

namespace attnreplay {

namespace {

std::uint64_t quarter_of_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
  return pages > 0 && page_size > 0 ? static_cast<std::uint64_t>(pages) * page_size / 4 : 0;
}

}  // namespace

std::uint64_t default_prefetch_bytes() {
  constexpr std::uint64_t kFourGiB = 4ull << 30;
  const std::uint64_t quarter = quarter_of_memory();
  return quarter > 0 ? std::min(quarter, kFourGiB) : kFourGiB;
}

BytePool::Hooks read_ahead_memory(const ReplayOptions& options) {
  if (!gpu_reference_available()) return {};
  bool to_gpu = options.reference_device != "cpu";
  for (const Kernel* kernel : select_kernels(options.kernels)) to_gpu = to_gpu || kernel->description().device == "cuda";
  return to_gpu ? pinned_memory(current_gpu().index()) : BytePool::Hooks{};
}

std::vector<std::size_t> wanted_positions(CaptureSource& source, const std::function<bool(std::int64_t)>& wanted,
                                          std::vector<std::string>& errors) {
  std::vector<std::size_t> positions;
  for (std::size_t position = 0; position < source.size(); ++position) {
    try {
      if (!wanted || wanted(source.load(position, /*with_data=*/false).call_index)) positions.push_back(position);
    } catch (const InputError& error) {
      errors.push_back(error.what());
    }
  }
  return positions;
}

namespace {

// A call whose kernels are not all replayed yet, with when it was read and how long that took.
struct WaitingCall {
  std::unique_ptr<CallInReplay> replay;
  double began_s = 0, read_s = 0;
};

// Tells the selected kernels which calls will come, so that those that compile per kind of call
// can start ahead (Kernel::expect_calls). Headers only: no tensor is read.
void announce_calls(CaptureSource& source, const std::vector<std::size_t>& positions, const ReplayOptions& options) {
  const std::vector<const Kernel*> kernels = select_kernels(options.kernels);
  if (std::none_of(kernels.begin(), kernels.end(), [](const Kernel* k) { return k->compiles_ahead(); })) return;
  std::vector<AttentionCall> headers;
  for (const std::size_t position : positions) {
    try {
      headers.push_back(source.load(position, /*with_data=*/false));
    } catch (const InputError&) {
      // Said where the call is read for its replay.
    }
  }
  for (const Kernel* kernel : kernels) {
    if (kernel->compiles_ahead()) kernel->expect_calls(headers, options.kernel_options);
  }
}

}  // namespace

void replay_capture(CaptureSource& source, const std::function<bool(std::int64_t)>& wanted,
                    const ReplayOptions& options, Report& report,
                    const std::function<void(const CallResult&)>& on_call,
                    const std::function<void(const AttentionCall&)>& on_loaded) {
  for (const std::string& error : source.open_errors()) report.input_errors.push_back(error);
  const std::vector<std::size_t> positions = wanted_positions(source, wanted, report.input_errors);
  if (options.progress) options.progress->add_calls(static_cast<std::int64_t>(positions.size()));
  announce_calls(source, positions, options);
  CallPrefetcher calls(source, positions, options.prefetch_bytes, read_ahead_memory(options));
  // Kernels not ready yet (kernels/kernel.h: a library importing, a compilation ahead) have their
  // part of each call deferred while the others go on; calls are finished, and reported, in order.
  // The calls held meanwhile (their tensors and references) stay within a quarter of the memory,
  // or the read-ahead budget where that is more, past which the replay waits.
  std::deque<WaitingCall> waiting;
  std::uint64_t held = 0;
  const std::uint64_t hold_at_most = std::max(options.prefetch_bytes, quarter_of_memory());
  const auto finish_front = [&] {
    WaitingCall front = std::move(waiting.front());
    waiting.pop_front();
    held -= front.replay->bytes_held();
    CallResult result;
    try {
      result = front.replay->finish();
    } catch (const InputError& error) {
      report.input_errors.push_back(error.what());
      return;
    }
    result.replay_seconds["read"] = front.read_s;
    if (options.progress) options.progress->call_finished();
    if (on_call) on_call(result);
    result.replay_began_s = front.began_s;
    result.replay_ended_s = seconds_since_process_start();
    report.calls.push_back(std::move(result));
  };
  for (;;) {
    try {
      const double began_s = seconds_since_process_start();
      const std::optional<AttentionCall> call = calls.next();
      if (!call) break;
      const double read_s = seconds_since_process_start() - began_s;
      if (on_loaded) on_loaded(*call);
      auto replay = std::make_unique<CallInReplay>(*call, options,
                                                   fmt::format("{} --calls {}", shell_quote(source.path()), call->call_index));
      replay->replay_ready_kernels();
      held += replay->bytes_held();
      waiting.push_back({std::move(replay), began_s, read_s});
    } catch (const InputError& error) {
      report.input_errors.push_back(error.what());
    }
    while (!waiting.empty() && (waiting.front().replay->replay_ready_kernels() || held > hold_at_most)) {
      finish_front();
    }
  }
  while (!waiting.empty()) finish_front();
}

}  // namespace attnreplay
