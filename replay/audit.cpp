#include "replay/audit.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <set>

#include "formats/errors.h"
#include "kernels/kernel.h"
#include "kernels/quantized_kernel.h"
#include "replay/generate.h"
#include "replay/prefetch.h"

namespace attnreplay {

// ---- Pure statistics ----

const std::vector<std::string>& audited_statistics() {
  static const std::vector<std::string> names{"rel_l2", "cosine", "max_abs", "mean_abs", "rmse"};
  return names;
}

double statistic_of(const ErrorStats& error, const std::string& name) {
  if (name == "rel_l2") return error.rel_l2;
  if (name == "cosine") return error.cosine;
  if (name == "max_abs") return error.max_abs;
  if (name == "mean_abs") return error.mean_abs;
  if (name == "rmse") return error.rmse;
  throw std::invalid_argument("unknown error statistic '" + name + "'");
}

std::string_view verdict_name(Verdict verdict) {
  switch (verdict) {
    case Verdict::passed: return "passed";
    case Verdict::failed: return "failed";
    case Verdict::not_run: return "not_run";
  }
  return "?";
}

KernelVerdict verdict_of(std::span<const Disposition> dispositions) {
  KernelVerdict v;
  for (const Disposition d : dispositions) {
    switch (d) {
      case Disposition::passed: ++v.calls_judged; break;
      case Disposition::incorrect: ++v.calls_judged, ++v.calls_failing; break;
      // An audit always judges; a result without thresholds still ran and counts as judged-within.
      case Disposition::not_verified: ++v.calls_judged; break;
      case Disposition::not_supported: ++v.calls_not_supported; break;
      case Disposition::failed: ++v.calls_errored; break;
    }
  }
  if (v.calls_failing > 0 || v.calls_errored > 0) v.verdict = Verdict::failed;
  else if (v.calls_judged > 0) v.verdict = Verdict::passed;
  else v.verdict = Verdict::not_run;
  return v;
}

std::vector<std::size_t> worst_first(const std::vector<const ErrorStats*>& errors) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < errors.size(); ++i)
    if (errors[i]) order.push_back(i);
  auto nonfinite = [&](std::size_t i) { return errors[i]->nan_count + errors[i]->inf_count > 0; };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (nonfinite(a) != nonfinite(b)) return nonfinite(a);
    const double ra = errors[a]->rel_l2, rb = errors[b]->rel_l2;
    if (std::isnan(ra) != std::isnan(rb)) return std::isnan(ra);  // NaN is no better than anything
    return ra > rb;
  });
  return order;
}

StoppingRule audit_stopping_rule(bool gpu) {
  StoppingRule rule;
  rule.warmup_runs = gpu ? 3 : 1;
  rule.min_samples = gpu ? 5 : 3;
  rule.min_time_s = 0;
  rule.max_noise = 1.0;  // stop at the minimum unless the samples are wild
  rule.timeout_s = gpu ? 2.0 : 1.0;
  return rule;
}

bool AuditReport::any_verdict_failed() const {
  return std::any_of(kernels.begin(), kernels.end(), [](const KernelAudit& k) { return k.verdict.verdict == Verdict::failed; });
}

// ---- Summaries of a filled report ----

namespace {

// The dtype whose default thresholds judged `kernel` on `call`, as the runner chose it.
DType judged_dtype(const std::string& kernel, const CallResult& call) {
  const DType input = parse_dtype(call.dtype).value_or(DType::float32);
  if (const Kernel* k = KernelRegistry::instance().find(kernel)) return k->description().reduced_precision.value_or(input);
  return input;  // model-output: the model's own precision
}

std::string describe_limits(const RefcheckLimits& t) {
  // Enough digits that fp32's 1 - 1e-8 does not print as 1.
  std::string text = fmt::format("cosine >= {:.12g}, rel_l2 <= {:.12g}", t.min_cosine, t.max_rel_l2);
  if (t.max_abs) text += fmt::format(", max_abs <= {:.12g}", *t.max_abs);
  return text;
}

bool is_reference_kernel(const std::string& name) {
  const Kernel* k = KernelRegistry::instance().find(name);
  return k && k->description().is_reference;
}

const KernelResult* find_kernel(const CallResult& call, const std::string& name) {
  for (const KernelResult& k : call.kernels)
    if (k.kernel == name) return &k;
  return nullptr;
}

double median_of(std::vector<double> values) { return distribution_of(std::move(values)).median; }

}  // namespace

void summarize_audit(AuditReport& report, const RefcheckThresholds& thresholds,
                     const std::map<std::pair<std::size_t, std::string>, std::vector<HeadError>>& per_head) {
  const std::vector<CallResult>& calls = report.replay.calls;
  std::vector<std::string> names;  // in the order kernels first appear
  for (const CallResult& call : calls)
    for (const KernelResult& k : call.kernels)
      if (std::find(names.begin(), names.end(), k.kernel) == names.end()) names.push_back(k.kernel);

  report.kernels.clear();
  for (const std::string& name : names) {
    KernelAudit audit;
    audit.kernel = name;
    std::vector<Disposition> dispositions;
    std::vector<const ErrorStats*> errors;
    std::vector<std::size_t> call_of_error;
    std::map<std::string, std::vector<double>> values;
    std::vector<double> times, tflops;
    std::set<std::string> limits;
    for (std::size_t i = 0; i < calls.size(); ++i) {
      const KernelResult* k = find_kernel(calls[i], name);
      if (!k) continue;
      dispositions.push_back(k->disposition);
      auto& reasons = audit.not_supported_reasons;
      if (k->disposition == Disposition::not_supported &&
          std::find(reasons.begin(), reasons.end(), k->reason) == reasons.end()) {
        reasons.push_back(k->reason);
      }
      if (k->error) {
        errors.push_back(&*k->error);
        call_of_error.push_back(i);
        for (const std::string& statistic : audited_statistics()) values[statistic].push_back(statistic_of(*k->error, statistic));
        limits.insert(describe_limits(refcheck_limits(thresholds, judged_dtype(name, calls[i]))));
      }
      if (k->timing && !k->timing->untimed()) {
        times.push_back(k->timing->median_s);
        tflops.push_back(k->tflops());
      }
    }
    for (const std::string& statistic : audited_statistics()) audit.errors[statistic] = distribution_of(values[statistic]);
    audit.median_time_s = distribution_of(times);
    audit.tflops = distribution_of(tflops);
    audit.verdict = verdict_of(dispositions);
    audit.thresholds.assign(limits.begin(), limits.end());
    // The reference against itself is exact by construction: no worst calls to show.
    if (!is_reference_kernel(name)) {
      const std::vector<std::size_t> order = worst_first(errors);
      for (std::size_t rank = 0; rank < order.size() && rank < static_cast<std::size_t>(std::max(report.worst_count, 0)); ++rank) {
        WorstCall worst;
        worst.call = call_of_error[order[rank]];
        if (auto found = per_head.find({worst.call, name}); found != per_head.end()) worst.per_head = found->second;
        audit.worst.push_back(std::move(worst));
      }
    }
    report.kernels.push_back(std::move(audit));
  }

  // Shape groups, in the order of their first call.
  report.shapes.clear();
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const CallResult& call = calls[i];
    auto same = [&call](const ShapeGroup& g) {
      return g.shape == call.shape && g.layout == call.layout && g.dtype == call.dtype && g.is_causal == call.is_causal &&
             (!call.is_causal || g.causal_alignment == call.causal_alignment);
    };
    auto group = std::find_if(report.shapes.begin(), report.shapes.end(), same);
    if (group == report.shapes.end()) {
      ShapeGroup g;
      g.shape = call.shape;
      g.layout = call.layout;
      g.dtype = call.dtype;
      g.is_causal = call.is_causal;
      g.causal_alignment = call.causal_alignment;
      g.scale = call.scale;
      report.shapes.push_back(std::move(g));
      group = report.shapes.end() - 1;
    }
    group->calls.push_back(i);
    group->any_mask = group->any_mask || call.mask != "none";
  }
  for (ShapeGroup& group : report.shapes) {
    for (const std::string& name : names) {
      ShapeGroup::KernelSummary summary;
      summary.kernel = name;
      std::vector<double> rel_l2, cosine, max_abs, times, tflops;
      for (const std::size_t i : group.calls) {
        const KernelResult* k = find_kernel(calls[i], name);
        if (!k || !k->error) continue;
        rel_l2.push_back(k->error->rel_l2);
        cosine.push_back(k->error->cosine);
        max_abs.push_back(k->error->max_abs);
        if (k->timing && !k->timing->untimed()) times.push_back(k->timing->median_s), tflops.push_back(k->tflops());
      }
      summary.calls = static_cast<std::int64_t>(rel_l2.size());
      if (summary.calls == 0) continue;
      summary.median_rel_l2 = median_of(rel_l2);
      summary.median_cosine = median_of(cosine);
      summary.median_max_abs = median_of(max_abs);
      if (!times.empty()) summary.median_time_s = median_of(times), summary.median_tflops = median_of(tflops);
      group.kernels.push_back(std::move(summary));
    }
  }
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
              output_in_dtype(emulate_attention(call, *kind, options.replay.quant, stage.stages), call.q.dtype);
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

}  // namespace

void run_audit(const std::vector<std::string>& inputs, const AuditOptions& options, AuditReport& report) {
  report.worst_count = options.worst_count;
  report.random_compare = options.random_compare;
  report.random_seeds = options.random_compare ? options.random_seeds : 0;
  report.attribute = options.attribute;
  report.cast_inputs = options.cast_inputs;
  report.quant = options.replay.quant;

  ReplayOptions replay = options.replay;
  if (!replay.refcheck) replay.refcheck = RefcheckThresholds{};  // an audit always judges
  replay.rerun_command = "attnreplay audit";
  replay.rerun_base += options.audit_only_flags;
  if (options.cast_inputs) replay.rerun_base += fmt::format(" --cast-inputs {}", dtype_name(*options.cast_inputs));
  std::map<std::pair<std::size_t, std::string>, std::vector<HeadError>> per_head;
  std::size_t current = 0;
  replay.on_kernel_output = [&per_head, &current](const AttentionCall&, const ReferenceOutput& reference,
                                                  const KernelResult& result, const HostTensor& output) {
    per_head[{current, result.kernel}] = compare_per_head(output, reference);
  };

  std::vector<std::unique_ptr<CaptureSource>> sources;
  std::vector<CallOrigin> origins;
  for (const std::string& input : inputs) {
    const std::size_t input_index = sources.size();
    sources.emplace_back();
    try {
      sources.back() = open_capture(input);
    } catch (const InputError& error) {
      report.replay.input_errors.push_back(error.what());
      continue;
    }
    CaptureSource& source = *sources.back();
    for (const std::string& error : source.open_errors()) report.replay.input_errors.push_back(error);
    const std::vector<std::size_t> positions = wanted_positions(source, options.wanted_calls, report.replay.input_errors);
    CallPrefetcher prefetcher(source, positions, options.replay.prefetch_bytes, read_ahead_memory(options.replay));
    for (std::size_t done = 0; done < positions.size(); ++done) {
      current = report.replay.calls.size();
      try {
        std::optional<AttentionCall> loaded = prefetcher.next();
        AttentionCall call = std::move(*loaded);
        const std::string captured_dtype(dtype_name(call.q.dtype));
        if (options.cast_inputs) call = cast_inputs(std::move(call), *options.cast_inputs);
        if (options.progress) {
          options.progress(fmt::format("{}: call {} ({} of {} in this input)", source.path(), call.call_index,
                                       done + 1, positions.size()));
        }
        std::optional<InputDiagnostics> diagnostics;
        if (options.attribute) diagnostics = diagnose_inputs(call, options.replay.quant.quant_gran);
        CallResult result =
            replay_call(call, replay, fmt::format("{} --calls {}", shell_quote(source.path()), call.call_index));
        if (options.cast_inputs && captured_dtype != dtype_name(*options.cast_inputs)) {
          result.notes.push_back(fmt::format("inputs cast from {} to {} (--cast-inputs); the model's output is not compared",
                                             captured_dtype, dtype_name(*options.cast_inputs)));
        }
        report.replay.calls.push_back(std::move(result));
        report.diagnostics.push_back(diagnostics);
        origins.push_back({input_index, positions[done]});
      } catch (const InputError& error) {
        std::erase_if(per_head, [current](const auto& entry) { return entry.first.first == current; });
        report.replay.input_errors.push_back(error.what());
      }
    }
  }
  summarize_audit(report, *replay.refcheck, per_head);
  if (options.attribute) attribute_worst_calls(report, options, sources, origins);
  if (options.random_compare) {
    ReplayOptions random = options.replay;
    random.refcheck = replay.refcheck;
    compare_with_random(report, random, options.random_seeds, options.progress);
  }
}

}  // namespace attnreplay
