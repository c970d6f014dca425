#include "replay/run/end_to_end.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "formats/capture_source.h"
#include "formats/errors.h"
#include "formats/tensor_file.h"
#include "replay/judge/compare.h"
#include "replay/judge/tensor_distance.h"
#include "replay/run/replay_call.h"
#include "replay/run/replay_options.h"

extern char** environ;

namespace attnreplay {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

struct RunOutcome {
  double wall_s = 0;
  std::string stderr_text;
};

// The job with `extra` added to this process's environment (ATTNCAP_* of the caller left out, so
// that both runs see the same), its stdout and stderr in files of `folder`.
RunOutcome run_job(const EndToEndOptions& options, const std::string& name, const fs::path& folder,
                   const std::map<std::string, std::string>& extra) {
  fs::create_directories(folder);
  std::vector<std::string> environment;
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string text(*entry);
    const std::string key = text.substr(0, text.find('='));
    if (key.rfind("ATTNCAP_", 0) == 0 || extra.count(key)) continue;
    environment.push_back(text);
  }
  for (const auto& [key, value] : extra) environment.push_back(key + "=" + value);
  std::vector<char*> envp, argv;
  for (auto& text : environment) envp.push_back(text.data());
  envp.push_back(nullptr);
  std::vector<std::string> command = options.command;
  for (auto& word : command) argv.push_back(word.data());
  argv.push_back(nullptr);
  const std::string out_path = (folder / "stdout.txt").string(), err_path = (folder / "stderr.txt").string();
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) throw InputError(fmt::format("e2e: cannot start the {} run: fork failed", name));
  if (pid == 0) {
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0 || err < 0) _exit(126);
    dup2(out, 1);
    dup2(err, 2);
    execvpe(argv[0], argv.data(), envp.data());
    dprintf(2, "e2e: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  RunOutcome outcome;
  outcome.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::ifstream err_file(err_path);
  std::stringstream text;
  text << err_file.rdbuf();
  outcome.stderr_text = text.str();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    const std::string& all = outcome.stderr_text;
    const std::string tail = all.size() > 2000 ? all.substr(all.size() - 2000) : all;
    throw InputError(fmt::format("e2e: the {} run of `{}` {} (its stderr: {}); the last of it:\n{}", name,
                                 fmt::join(options.command, " "),
                                 WIFEXITED(status) ? fmt::format("exited with {}", WEXITSTATUS(status))
                                                   : fmt::format("was killed by signal {}", WTERMSIG(status)),
                                 err_path, tail));
  }
  return outcome;
}

// The preload first, then whatever the caller's LD_PRELOAD already holds (a profiler, an allocator),
// which both runs keep.
std::string preload_before_the_callers(const std::string& preload) {
  const char* callers = std::getenv("LD_PRELOAD");
  if (!callers || !*callers) return preload;
  return fmt::format("{}:{}", preload, callers);
}

// Each output the job wrote, moved out of its way into the run's folder (the next run writes it
// again). Returns the moved files by output.
std::map<std::string, fs::path> collect_outputs(const EndToEndOptions& options, const std::string& name,
                                                const fs::path& folder) {
  std::map<std::string, fs::path> moved;
  for (const std::string& output : options.outputs) {
    if (!fs::exists(output)) {
      throw InputError(fmt::format("e2e: the {} run did not write {}, which --outputs names", name, output));
    }
    const fs::path target = folder / "outputs" / fs::path(output).filename();
    fs::create_directories(target.parent_path());
    fs::remove(target);
    fs::copy_file(output, target);
    fs::remove(output);
    moved[output] = target;
  }
  return moved;
}

// The preload's account of substitution at exit ("[attncap] pid N: substitution by K: S attention
// calls substituted (WHERE, TIME), L left to the original op (TIME)", then one line per reason).
json substitution_account(const std::string& stderr_text) {
  json account = {{"substituted", 0}, {"left", 0}, {"left_by_reason", json::object()}, {"reported", false}};
  const std::regex summary(R"(\[attncap\] pid \d+: substitution by \S+: (\d+) attention calls substituted \(([^)]*)\), (\d+) left to the original op \(([^)]*)\))");
  const std::regex reason(R"(\[attncap\]   (\d+) left: (.*))");
  std::istringstream lines(stderr_text);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, summary)) {
      account["substituted"] = account["substituted"].get<std::int64_t>() + std::stoll(m[1]);
      account["left"] = account["left"].get<std::int64_t>() + std::stoll(m[3]);
      // "(on the job's own tensors, 0.031 s)": where the kernel ran, then the time.
      const std::string substituted = m[2].str();
      const std::size_t last = substituted.rfind(", ");
      account["substituted_where"] = last == std::string::npos ? "" : substituted.substr(0, last);
      account["substituted_time"] = last == std::string::npos ? substituted : substituted.substr(last + 2);
      account["left_time"] = m[4].str();
      account["reported"] = true;
    } else if (std::regex_search(line, m, reason)) {
      auto& count = account["left_by_reason"][m[2].str()];
      count = (count.is_null() ? 0 : count.get<std::int64_t>()) + std::stoll(m[1]);
    }
  }
  return account;
}

json distance_json(const TensorDistance& d) {
  json j = {{"elements", d.elements}, {"differing", d.differing}, {"nonfinite", d.nonfinite},
            {"max_abs", d.max_abs},   {"rel_l2", d.rel_l2},       {"cosine", d.cosine}};
  j["psnr_db"] = std::isfinite(d.psnr_db) ? json(d.psnr_db) : json("inf");
  if (d.first_difference) j["first_difference"] = *d.first_difference;
  return j;
}

json compare_outputs(const std::map<std::string, fs::path>& original, const std::map<std::string, fs::path>& substituted) {
  json files = json::array();
  for (const auto& [output, original_path] : original) {
    const auto as_is = read_tensor_file(original_path.string());
    const auto with_kernel = read_tensor_file(substituted.at(output).string());
    json tensors = json::array();
    for (const auto& [name, reference] : as_is) {
      const auto found = std::find_if(with_kernel.begin(), with_kernel.end(), [&](const auto& t) { return t.first == name; });
      json entry = {{"tensor", name}, {"dtype", dtype_name(reference.dtype)}, {"shape", reference.shape}};
      if (found == with_kernel.end()) {
        entry["missing"] = "not in the substituted run's file";
      } else {
        entry["distance"] = distance_json(tensor_distance(found->second, reference, fmt::format("{} {}", output, name)));
        if (const auto ssim = image_ssim(found->second, reference)) entry["distance"]["ssim"] = *ssim;
        // Logits by name: top-1 agreement and KL, as LLM users compare them.
        std::string lower = name + " " + fs::path(output).filename().string();
        std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
        if (dtype_is_floating(reference.dtype) && lower.find("logit") != std::string::npos) {
          const LogitAgreement a = logit_agreement(found->second, reference);
          entry["logits"] = {{"rows", a.rows}, {"top1_agreement", a.top1}, {"mean_kl", a.mean_kl}};
        }
      }
      tensors.push_back(std::move(entry));
    }
    files.push_back({{"output", output}, {"tensors", std::move(tensors)}});
  }
  return files;
}

// The preload's attention clock at exit (ATTNCAP_TIME_ATTENTION): "[attncap] pid N: attention took
// X s of GPU time over N calls (...), Y s of wall time over M calls (...)", summed over processes.
json attention_time(const std::string& stderr_text) {
  json time = {{"gpu_s", 0.0}, {"gpu_calls", 0}, {"gpu_first_call_s", 0.0}, {"wall_s", 0.0}, {"wall_calls", 0}};
  const std::regex gpu(R"(([0-9.]+) s of GPU time over (\d+) calls)"), wall(R"(([0-9.]+) s of wall time over (\d+) calls)");
  const std::regex first(R"(the first call ([0-9.]+) s)");
  std::istringstream lines(stderr_text);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("[attncap] pid ") == std::string::npos || line.find(": attention took ") == std::string::npos) continue;
    std::smatch m;
    if (std::regex_search(line, m, gpu)) {
      time["gpu_s"] = time["gpu_s"].get<double>() + std::stod(m[1]);
      time["gpu_calls"] = time["gpu_calls"].get<std::int64_t>() + std::stoll(m[2]);
    }
    if (std::regex_search(line, m, first)) time["gpu_first_call_s"] = time["gpu_first_call_s"].get<double>() + std::stod(m[1]);
    if (std::regex_search(line, m, wall)) {
      time["wall_s"] = time["wall_s"].get<double>() + std::stod(m[1]);
      time["wall_calls"] = time["wall_calls"].get<std::int64_t>() + std::stoll(m[2]);
    }
  }
  return time;
}

std::unique_ptr<CaptureSource> open_run_capture(const std::string& folder, const std::string& name) {
  if (!fs::exists(folder) || fs::is_empty(folder)) {
    throw InputError(fmt::format("e2e: the {} run captured nothing into {} (did the job call attention, and did the "
                                 "preload load? see its stderr.txt)", name, folder));
  }
  return open_capture(folder);
}

// `tensor` (q or out of `call`) as (b, h, s, d) doubles with the rows that see no key zeroed: a
// left-padded prompt's pads have no defined attention, and backends fill them differently (0, NaN,
// the mean of V), which would swamp every distance.
HostTensor rows_with_a_key(const HostTensor& tensor, const AttentionCall& call, const ReferenceOutput& reference) {
  const HostTensor bhsd = to_bhsd(tensor, call.layout);
  std::vector<double> values = bhsd.to_doubles();
  if (!reference.no_key.empty() && bhsd.rank() == 4 && !reference.sampled) {
    const auto rows = static_cast<std::size_t>(bhsd.shape[0] * bhsd.shape[1] * bhsd.shape[2]);
    const auto width = static_cast<std::size_t>(bhsd.shape[3]);
    // no_key is per (batch, query head, row); a query with fewer heads (never, for SDPA) is left whole.
    if (reference.no_key.size() == rows) {
      for (std::size_t row = 0; row < rows; ++row) {
        if (reference.no_key[row]) std::fill_n(values.begin() + static_cast<std::ptrdiff_t>(row * width), width, 0.0);
      }
    }
  }
  return HostTensor::from_doubles(DType::float64, bhsd.shape, values);
}

// Call by call: the substituted run's output against the exact attention of its own inputs, and
// its queries and output against the run as is, over the rows that see a key. Calls pair by index:
// the same job, seeded alike, makes the same calls in the same order (until its outputs part: an
// LLM's steps after its first divergent token see other tokens).
json compare_calls(CaptureSource& original, CaptureSource& substituted) {
  json calls = json::array();
  const std::size_t count = std::min(original.size(), substituted.size());
  ReplayOptions reference_options;
  for (std::size_t i = 0; i < count; ++i) {
    const AttentionCall as_is = original.load(i);
    const AttentionCall with_kernel = substituted.load(i);
    json entry = {{"call_index", with_kernel.call_index}, {"op", with_kernel.op}};
    for (const char* key : {"layer", "step"}) {
      if (auto found = with_kernel.metadata.find(key); found != with_kernel.metadata.end()) {
        entry[key] = std::stoll(found->second);
      }
    }
    if (auto found = with_kernel.metadata.find("substituted_by"); found != with_kernel.metadata.end()) {
      entry["substituted_by"] = found->second;
    } else if (auto left = with_kernel.metadata.find("substitution_left"); left != with_kernel.metadata.end()) {
      entry["left"] = left->second;
    }
    const std::string where = with_kernel.where();
    if (with_kernel.q.shape != as_is.q.shape || with_kernel.k.shape != as_is.k.shape || !with_kernel.out || !as_is.out ||
        with_kernel.out->shape != as_is.out->shape) {
      entry["unpaired"] = "the two runs' calls at this index differ in shape, or one has no output";
      calls.push_back(std::move(entry));
      continue;
    }
    const ReferenceOutput reference = reference_for(with_kernel, reference_options);
    const ErrorStats own = compare_to_reference(to_bhsd(*with_kernel.out, with_kernel.layout), reference);
    entry["own_rel_l2"] = own.rel_l2;  // over the rows that see a key, as every judging figure
    entry["own_cosine"] = own.cosine;
    if (own.no_key_rows > 0) entry["rows_without_a_key"] = own.no_key_rows;
    entry["input_rel_l2"] = tensor_distance(rows_with_a_key(with_kernel.q, with_kernel, reference),
                                            rows_with_a_key(as_is.q, as_is, reference), where + " q").rel_l2;
    entry["output_rel_l2"] = tensor_distance(rows_with_a_key(*with_kernel.out, with_kernel, reference),
                                             rows_with_a_key(*as_is.out, as_is, reference), where + " out").rel_l2;
    calls.push_back(std::move(entry));
  }
  return calls;
}

// The worst of each distance over the calls `key` groups (layer or step), and how many there are.
json worst_by(const json& calls, const char* key, const std::function<bool(const json&)>& wanted) {
  std::map<std::int64_t, json> groups;
  for (const json& call : calls) {
    if (!call.contains(key) || !call.contains("own_rel_l2") || !wanted(call)) continue;
    json& group = groups[call[key].get<std::int64_t>()];
    if (group.is_null()) group = {{key, call[key]}, {"calls", 0}, {"substituted", 0}, {"own_rel_l2", 0.0},
                                  {"input_rel_l2", 0.0}, {"output_rel_l2", 0.0}};
    group["calls"] = group["calls"].get<int>() + 1;
    if (call.contains("substituted_by")) group["substituted"] = group["substituted"].get<int>() + 1;
    for (const char* figure : {"own_rel_l2", "input_rel_l2", "output_rel_l2"}) {
      group[figure] = std::max(group[figure].get<double>(), call[figure].get<double>());
    }
  }
  json list = json::array();
  for (auto& [index, group] : groups) list.push_back(std::move(group));
  return list;
}

}  // namespace

json run_end_to_end(const EndToEndOptions& options) {
  if (options.command.empty()) throw InputError("e2e: give the job's command after --");
  if (!fs::exists(options.preload)) {
    throw InputError(fmt::format("e2e: the capture preload {} does not exist (--preload names it)", options.preload));
  }
  for (const std::string& output : options.outputs) {
    if (fs::exists(output)) {
      throw InputError(fmt::format("e2e: {} exists before the job runs: remove it, so that each run's file is that "
                                   "run's own", output));
    }
  }
  const fs::path workdir(options.workdir);
  json record = {{"command", options.command}, {"kernel", options.kernel}, {"workdir", options.workdir}};
  json runs = json::array();
  std::map<std::string, std::map<std::string, fs::path>> outputs;
  std::map<std::string, std::unique_ptr<CaptureSource>> captures;
  for (const std::string name : {"original", "substituted"}) {
    const fs::path folder = workdir / name;
    fs::remove_all(folder / "capture");
    std::map<std::string, std::string> extra = {{"LD_PRELOAD", preload_before_the_callers(options.preload)},
                                                {"ATTNCAP_TIME_ATTENTION", "1"}};
    if (options.per_layer) extra["ATTNCAP_OUT"] = (folder / "capture").string();
    if (name == "substituted") {
      extra["ATTNCAP_SUBSTITUTE"] = options.kernel;
      if (!options.calls.empty()) extra["ATTNCAP_SUBSTITUTE_CALLS"] = options.calls;
      if (!options.layers.empty()) extra["ATTNCAP_SUBSTITUTE_LAYERS"] = options.layers;
      if (!options.steps.empty()) extra["ATTNCAP_SUBSTITUTE_STEPS"] = options.steps;
    }
    const RunOutcome outcome = run_job(options, name, folder, extra);
    outputs[name] = collect_outputs(options, name, folder);
    json run = {{"run", name}, {"wall_s", outcome.wall_s}, {"stderr", (folder / "stderr.txt").string()}};
    run["attention"] = attention_time(outcome.stderr_text);
    run["attention_s"] = run["attention"]["gpu_s"].get<double>() + run["attention"]["wall_s"].get<double>();
    run["attention_calls"] = run["attention"]["gpu_calls"].get<std::int64_t>() + run["attention"]["wall_calls"].get<std::int64_t>();
    if (options.per_layer) captures[name] = open_run_capture((folder / "capture").string(), name);
    if (name == "substituted") {
      run["substitution"] = substitution_account(outcome.stderr_text);
      if (!run["substitution"]["reported"].get<bool>()) {
        // The preload's own reason, where it gave one ("ATTNCAP_SUBSTITUTE=K is off, ...: no kernel named K").
        std::string said;
        std::istringstream lines(outcome.stderr_text);
        for (std::string line; std::getline(lines, line);) {
          if (line.find("[attncap]") != std::string::npos && line.find("ATTNCAP_SUBSTITUTE") != std::string::npos) {
            said += "\n  " + line;
          }
        }
        throw InputError(fmt::format("e2e: the substituted run gave no account of substitution: the preload did not "
                                     "substitute {}, because the job loaded no torch or substitution was off (its "
                                     "stderr: {}){}", options.kernel,
                                     (folder / "stderr.txt").string(), said));
      }
    }
    runs.push_back(std::move(run));
  }
  record["runs"] = std::move(runs);
  record["outputs"] = compare_outputs(outputs["original"], outputs["substituted"]);
  if (options.per_layer) {
    CaptureSource& original = *captures["original"];
    CaptureSource& substituted = *captures["substituted"];
    record["calls"] = compare_calls(original, substituted);
    // Through the layers within the first step that substituted a call (later steps of an LLM may
    // already see other tokens); then step by step.
    std::optional<std::int64_t> first_step;
    for (const json& call : record["calls"]) {
      if (call.contains("substituted_by") && call.contains("step")) {
        first_step = call["step"].get<std::int64_t>();
        break;
      }
    }
    if (first_step) {
      record["layers_step"] = *first_step;
      record["layers"] = worst_by(record["calls"], "layer", [&](const json& call) {
        return call.contains("step") && call["step"].get<std::int64_t>() == *first_step;
      });
    }
    record["steps"] = worst_by(record["calls"], "step", [](const json&) { return true; });
    if (original.size() != substituted.size()) {
      record["notes"].push_back(fmt::format("the runs made {} and {} attention calls: only the first {} are paired",
                                            original.size(), substituted.size(),
                                            std::min(original.size(), substituted.size())));
    }
  }
  return record;
}

}  // namespace attnreplay
