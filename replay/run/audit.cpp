#include "replay/run/audit.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "formats/errors.h"
#include "kernels/kernel.h"
#include "kernels/quantized_kernel.h"
#include "replay/judge/compare.h"
#include "replay/run/generate.h"
#include "replay/run/prefetch.h"
#include "replay/run/replay_call.h"
#include "replay/run/replay_capture.h"
#include "replay/run/rerun.h"

namespace attnreplay {

StoppingRule audit_stopping_rule(bool gpu) {
  StoppingRule rule;
  rule.warmup_runs = gpu ? 3 : 1;
  rule.min_samples = gpu ? 5 : 3;
  rule.min_time_s = 0;
  rule.max_noise = 1.0;  // stop at the minimum unless the samples are wild
  rule.timeout_s = gpu ? 2.0 : 1.0;
  return rule;
}

// ---- Measurement ----

namespace {

// Captured floating tensors rounded to `dtype`, as a model run in that precision would hand them
// to the kernel. The model's output no longer belongs to these inputs, so it is dropped.
AttentionCall cast_inputs(AttentionCall call, DType dtype) {
  for (HostTensor* tensor : {&call.q, &call.k, &call.v}) {
    if (tensor->dtype == dtype || !dtype_is_floating(tensor->dtype)) continue;
    HostTensor cast = HostTensor::from_doubles(dtype, tensor->shape, tensor->to_doubles());
    cast.captured_strides = tensor->captured_strides;
    cast.device = tensor->device;
    *tensor = std::move(cast);
  }
  call.out.reset();
  return call;
}

struct CallOrigin {
  std::size_t input = 0;
  std::size_t position = 0;
};

// The quantized kind a kernel implements (on the GPU or emulated), when it is one of ours.
std::optional<QuantizedKind> emulated_kind(const std::string& kernel) {
  const auto* quantized = dynamic_cast<const QuantizedAttentionKernel*>(KernelRegistry::instance().find(kernel));
  if (!quantized) return std::nullopt;
  return quantized->kind();
}

struct Stage {
  const char* name;
  EmulationStages stages;
};
// Cumulative, in the order the kernel applies them; "none" is the floor of fp32 arithmetic with
// the output rounded to the input dtype.
constexpr Stage kStages[] = {
    {"none", {false, false, false}},
    {"qk", {true, false, false}},
    {"qk+p", {true, true, false}},
    {"qk+p+pv", {true, true, true}},
};

void attribute_worst_calls(AuditReport& report, const AuditOptions& options,
                           std::vector<std::unique_ptr<CaptureSource>>& sources, const std::vector<CallOrigin>& origins) {
  std::map<std::size_t, AttentionCall> loaded;
  std::map<std::size_t, ReferenceOutput> references;
  auto call_at = [&](std::size_t index) -> const AttentionCall& {
    auto found = loaded.find(index);
    if (found != loaded.end()) return found->second;
    const CallOrigin& origin = origins.at(index);
    AttentionCall call = sources.at(origin.input)->load(origin.position);
    if (options.cast_inputs) call = cast_inputs(std::move(call), *options.cast_inputs);
    call.dropout_p = 0;  // as the replay ran it
    return loaded.emplace(index, std::move(call)).first->second;
  };
  for (KernelAudit& kernel : report.kernels) {
    const auto kind = emulated_kind(kernel.kernel);
    if (!kind) {
      if (!kernel.worst.empty()) kernel.attribution_note = "no staged emulation, which only the flash, sage and fa3 kinds have";
      continue;
    }
    for (WorstCall& worst : kernel.worst) {
      try {
        const AttentionCall& call = call_at(worst.call);
        auto reference = references.find(worst.call);
        if (reference == references.end()) reference = references.emplace(worst.call, reference_for(call, options.replay)).first;
        for (const Stage& stage : kStages) {
          const HostTensor output =
              output_in_dtype(emulate_attention(call, *kind, options.replay.kernel_options.quant, stage.stages), call.q.dtype);
          worst.attribution.push_back({stage.name, compare_to_reference(output, reference->second)});
        }
      } catch (const std::exception& error) {
        worst.attribution.clear();
        worst.attribution_note = fmt::format("attribution failed: {}", error.what());
      }
    }
  }
}

void compare_with_random(AuditReport& report, ReplayOptions replay, int seeds,
                         const std::function<void(const std::string&)>& progress) {
  replay.on_kernel_output = nullptr;
  replay.rerun_command = "attnreplay run";
  const std::uint64_t base_seed = replay.seed;
  for (ShapeGroup& group : report.shapes) {
    // A ragged batch's packed shape is not a call one could generate alike: its sequences' lengths
    // make its work. Such groups are audited on their captured calls alone (docs/cli.md).
    if (group.layout == Layout::thd) continue;
    GeneratedCallSpec spec;
    spec.shape = group.shape;
    spec.dtype = parse_dtype(group.dtype).value_or(DType::bfloat16);
    spec.is_causal = group.is_causal;
    spec.causal_alignment = group.causal_alignment;
    // The captured scale when it is not the default one: scores then have the captured spread.
    const double default_scale = 1.0 / std::sqrt(static_cast<double>(group.shape.head_dim_qk));
    if (std::abs(group.scale - default_scale) > 1e-6 * default_scale) spec.scale = group.scale;
    for (int i = 0; i < seeds; ++i) {
      spec.seed = base_seed + static_cast<std::uint64_t>(i);
      replay.seed = spec.seed;  // rows sampled as `attnreplay run --seed` (its rerun) samples them
      if (progress) progress(fmt::format("random inputs {}, seed {}", group.shape.to_string(), spec.seed));
      try {
        CallResult result = replay_call(generate_call(spec), replay, generated_call_flags(spec));
        if (group.any_mask) result.notes.push_back("the captured calls carry a mask; the random call has none");
        group.random.push_back(std::move(result));
      } catch (const InputError& error) {
        report.replay.input_errors.push_back(
            fmt::format("random inputs of {} (seed {}): {}", group.shape.to_string(), spec.seed, error.what()));
      }
    }
  }
}

// What an audit keeps while it replays: each call's per-head errors and where it came from.
struct AuditState {
  std::map<std::pair<std::size_t, std::string>, std::vector<HeadError>> per_head;
  std::size_t current = 0;  // the call being replayed, as an index into the report's calls
  std::vector<std::unique_ptr<CaptureSource>> sources;
  std::vector<CallOrigin> origins;
};

// One call of a capture, cast as asked, replayed into the report with its input diagnostics.
void audit_call(AttentionCall call, const CaptureSource& source, const AuditOptions& options,
                const ReplayOptions& replay, AuditReport& report) {
  const std::string captured_dtype(dtype_name(call.q.dtype));
  if (options.cast_inputs) call = cast_inputs(std::move(call), *options.cast_inputs);
  std::optional<InputDiagnostics> diagnostics;
  if (options.attribute) diagnostics = diagnose_inputs(call, options.replay.kernel_options.quant.quant_gran);
  CallResult result = replay_call(call, replay, fmt::format("{} --calls {}", shell_quote(source.path()), call.call_index));
  if (options.cast_inputs && captured_dtype != dtype_name(*options.cast_inputs)) {
    result.notes.push_back(fmt::format("inputs cast from {} to {} (--cast-inputs); the model's output is not compared",
                                       captured_dtype, dtype_name(*options.cast_inputs)));
  }
  report.replay.calls.push_back(std::move(result));
  report.diagnostics.push_back(diagnostics);
}

void audit_input(const std::string& input, const AuditOptions& options, const ReplayOptions& replay,
                 AuditReport& report, AuditState& state) {
  const std::size_t input_index = state.sources.size();
  state.sources.emplace_back();
  try {
    state.sources.back() = open_capture(input);
  } catch (const InputError& error) {
    report.replay.input_errors.push_back(error.what());
    return;
  }
  CaptureSource& source = *state.sources.back();
  for (const std::string& error : source.open_errors()) report.replay.input_errors.push_back(error);
  const std::vector<std::size_t> positions = wanted_positions(source, options.wanted_calls, report.replay.input_errors);
  CallPrefetcher prefetcher(source, positions, options.replay.prefetch_bytes, read_ahead_memory(options.replay));
  for (std::size_t done = 0; done < positions.size(); ++done) {
    state.current = report.replay.calls.size();
    try {
      AttentionCall call = std::move(*prefetcher.next());
      if (options.progress) {
        options.progress(fmt::format("{}: call {} ({} of {} in this input)", source.path(), call.call_index, done + 1,
                                     positions.size()));
      }
      audit_call(std::move(call), source, options, replay, report);
      state.origins.push_back({input_index, positions[done]});
    } catch (const InputError& error) {
      std::erase_if(state.per_head, [&state](const auto& entry) { return entry.first.first == state.current; });
      report.replay.input_errors.push_back(error.what());
    }
  }
}

}  // namespace

void run_audit(const std::vector<std::string>& inputs, const AuditOptions& options, AuditReport& report) {
  report.worst_count = options.worst_count;
  report.random_compare = options.random_compare;
  report.random_seeds = options.random_compare ? options.random_seeds : 0;
  report.attribute = options.attribute;
  report.cast_inputs = options.cast_inputs;
  report.quant = options.replay.kernel_options.quant;

  ReplayOptions replay = options.replay;
  if (!replay.refcheck) replay.refcheck = RefcheckThresholds{};  // an audit always judges
  replay.rerun_command = "attnreplay audit";
  replay.rerun_base += options.audit_only_flags;
  AuditState state;
  replay.on_kernel_output = [&state](const AttentionCall&, const ReferenceOutput& reference, const KernelResult& result,
                                     const HostTensor& output) {
    state.per_head[{state.current, result.kernel}] = compare_per_head(output, reference);
  };
  for (const std::string& input : inputs) audit_input(input, options, replay, report, state);
  summarize_audit(report, *replay.refcheck, state.per_head);
  if (options.attribute) attribute_worst_calls(report, options, state.sources, state.origins);
  if (options.random_compare) {
    ReplayOptions random = options.replay;
    random.refcheck = replay.refcheck;
    compare_with_random(report, random, options.random_seeds, options.progress);
  }
}

}  // namespace attnreplay
