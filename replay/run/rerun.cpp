#include "replay/run/rerun.h"

#include <fmt/format.h>

#include "formats/attention_call.h"
#include "replay/run/replay_options.h"

namespace attnreplay {

std::string shell_quote(const std::string& text) {
  if (!text.empty() && text.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=,:@%+") ==
                           std::string::npos) {
    return text;
  }
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string rerun_command(const ReplayOptions& options, const std::string& rerun_input, const std::string& kernel,
                          const AttentionCall& call) {
  // Sampled rows depend on the seed. A generated call's flags already carry it (as its inputs'
  // seed, which a run also samples rows with), and a second --seed is a usage error.
  const std::string seed_flag =
      options.ref_sample_rows > 0 && call.source != "generated" ? fmt::format(" --seed {}", options.seed) : "";
  return fmt::format("{} {} --kernels {}{}{}", options.rerun_command, rerun_input, kernel, options.rerun_base,
                     seed_flag);
}

}  // namespace attnreplay
