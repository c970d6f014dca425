#include "replay/run/replay_capture.h"

#include <fmt/format.h>

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

std::uint64_t default_prefetch_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
  const std::uint64_t quarter = pages > 0 && page_size > 0 ? static_cast<std::uint64_t>(pages) * page_size / 4 : 0;
  constexpr std::uint64_t kFourGiB = 4ull << 30;
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

void replay_capture(CaptureSource& source, const std::function<bool(std::int64_t)>& wanted,
                    const ReplayOptions& options, Report& report,
                    const std::function<void(const CallResult&)>& on_call,
                    const std::function<void(const AttentionCall&)>& on_loaded) {
  for (const std::string& error : source.open_errors()) report.input_errors.push_back(error);
  const std::vector<std::size_t> positions = wanted_positions(source, wanted, report.input_errors);
  if (options.progress) options.progress->add_calls(static_cast<std::int64_t>(positions.size()));
  CallPrefetcher calls(source, positions, options.prefetch_bytes, read_ahead_memory(options));
  for (;;) {
    try {
      const double began_s = seconds_since_process_start();
      const std::optional<AttentionCall> call = calls.next();
      if (!call) break;
      const double read_s = seconds_since_process_start() - began_s;
      if (on_loaded) on_loaded(*call);
      CallResult result =
          replay_call(*call, options, fmt::format("{} --calls {}", shell_quote(source.path()), call->call_index));
      result.replay_seconds["read"] = read_s;
      if (options.progress) options.progress->call_finished();
      if (on_call) on_call(result);
      result.replay_began_s = began_s;
      result.replay_ended_s = seconds_since_process_start();
      report.calls.push_back(std::move(result));
    } catch (const InputError& error) {
      report.input_errors.push_back(error.what());
    }
  }
}

}  // namespace attnreplay
