#pragma once
// `attnreplay e2e`: a job run twice under the capture preload, as is and with a kernel substituted
// for its attention (ATTNCAP_SUBSTITUTE), the same command and environment both times; then what
// it saved compared, and, from the two runs' captures, how the error grows layer by layer.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace attnreplay {

struct EndToEndOptions {
  std::vector<std::string> command;  // the job, as it would be typed
  std::string kernel;                // ATTNCAP_SUBSTITUTE
  std::vector<std::string> outputs;  // files the job writes, compared between the runs
  std::string workdir;               // each run's outputs, captures and logs go under it
  std::string preload;               // libattncap.so
  std::string calls, layers, steps;  // ATTNCAP_SUBSTITUTE_CALLS / _LAYERS / _STEPS, as given
  bool per_layer = true;             // capture both runs and compare call by call
};

// Runs both and compares. The JSON holds "runs" (command, wall time, attention time as the
// preload's clock gave it, ATTNCAP_TIME_ATTENTION, the substitution's account), "outputs" (per file and tensor: distances, logits' agreement where a
// tensor is named so), and "layers" and "calls" (each call's own error against the exact
// attention of its inputs, its inputs' and output's distance from the run as is). Throws
// InputError when a run fails or does not write an output it was said to.
nlohmann::json run_end_to_end(const EndToEndOptions& options);

}  // namespace attnreplay
