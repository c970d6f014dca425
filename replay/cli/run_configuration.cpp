#include "replay/cli/run_configuration.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <sstream>

#include "formats/errors.h"
#include "kernels/quantized_attention.h"
#include "replay/run/kernel_selection.h"

namespace attnreplay {
namespace {

// A value the parser's checks let through but that does not parse (a test-list line is parsed too).
[[noreturn]] void bad_value(std::string_view flag, const std::string& value, const std::vector<std::string>& expected) {
  throw InputError(fmt::format("{}: expected {}, got '{}'", flag, fmt::join(expected, ", "), value));
}

template <class Parse>
auto parsed(const Options& options, std::string_view flag, Parse parse, const std::vector<std::string>& names) {
  const std::string text = options.text(flag).value_or("");
  const auto value = parse(text);
  if (!value) bad_value(flag, text, names);
  return *value;
}

QuantOptions quant_options_from(const Options& o) {
  QuantOptions quant;
  quant.quant_gran = parsed(o, "--quant_gran", parse_quant_granularity, quant_granularity_names());
  quant.k_smooth = !o.flag("--no_k_smooth");
  quant.pv_accum = parsed(o, "--pv_accum_dtype", parse_pv_accum, pv_accum_names());
  quant.fp8_scale = parsed(o, "--fp8_scale", parse_fp8_scale, fp8_scale_names());
  return quant;
}

std::vector<std::int64_t> parse_ints(const std::string& text, std::string_view flag) {
  std::vector<std::int64_t> values;
  std::stringstream stream(text);
  for (std::string part; std::getline(stream, part, ',');) {
    try {
      std::size_t used = 0;
      values.push_back(std::stoll(part, &used));
      if (used != part.size()) throw std::invalid_argument(part);
    } catch (const std::exception&) {
      throw InputError(fmt::format("{}: expected integers, got '{}'", flag, text));
    }
  }
  return values;
}

AttentionShape generated_shape(const Options& o) {
  AttentionShape s{1, 1, 0, 128, 0, 64, 0};
  if (const auto shape = o.text("--shape")) {
    const auto dims = parse_ints(*shape, "--shape");
    if (dims.size() != 4) throw InputError(fmt::format("--shape: expected batch,heads,seq,head_dim, got '{}'", *shape));
    s.batch = dims[0], s.heads_q = dims[1], s.seq_q = dims[2], s.head_dim_qk = dims[3];
  }
  s.batch = o.integer("--batch_size").value_or(s.batch);
  s.heads_q = o.integer("--num_qo_heads").value_or(s.heads_q);
  s.seq_q = o.integer("--s_qo").value_or(s.seq_q);
  s.head_dim_qk = o.integer("--head_dim_qk").value_or(s.head_dim_qk);
  s.heads_kv = o.integer("--num_kv_heads").value_or(s.heads_q);
  s.seq_kv = o.integer("--s_kv").value_or(s.seq_q);
  s.head_dim_vo = o.integer("--head_dim_vo").value_or(s.head_dim_qk);
  if (s.heads_kv <= 0 || s.heads_q % s.heads_kv != 0) {
    throw InputError(fmt::format("--num_kv_heads: {} does not divide {} query heads", s.heads_kv, s.heads_q));
  }
  return s;
}

}  // namespace

void apply_stopping_flags(const Options& o, StoppingRule& rule) {
  if (const auto percent = o.number("--precision")) rule.precision = *percent / 100.0;
  if (const auto warmup = o.integer("--warmup")) rule.warmup_runs = static_cast<int>(*warmup);
  if (const auto samples = o.integer("--min-samples")) rule.min_samples = static_cast<int>(*samples);
  if (const auto seconds = o.number("--min-time")) rule.min_time_s = *seconds;
  if (const auto percent = o.number("--max-noise")) rule.max_noise = *percent / 100.0;
  if (const auto seconds = o.number("--timeout")) rule.timeout_s = *seconds;
}

ReplayOptions replay_options(const Options& o, const std::string& plugin_flags) {
  ReplayOptions r;
  r.kernels = o.list("--kernels");
  select_kernels(r.kernels);  // unknown names fail before any work
  const bool stdrel =
      parsed(o, "--stopping", parse_stopping_criterion, stopping_criterion_names()) == StoppingCriterion::stdrel;
  r.stopping = stdrel ? StoppingRule::cpu_stdrel() : StoppingRule::cpu_default();
  r.stopping_gpu = stdrel ? StoppingRule::gpu_stdrel() : StoppingRule::gpu_default();
  apply_stopping_flags(o, r.stopping);
  apply_stopping_flags(o, r.stopping_gpu);
  r.ref_sample_rows = o.integer("--ref-sample-rows").value_or(0);
  r.seed = static_cast<std::uint64_t>(o.integer("--seed").value_or(0));
  const auto min_cosine = o.number("--refcheck-min-cosine"), max_rel_l2 = o.number("--refcheck-max-rel-l2"),
             max_abs = o.number("--refcheck-max-abs");
  if (o.flag("--refcheck") || min_cosine || max_rel_l2 || max_abs) {
    r.refcheck = RefcheckThresholds{min_cosine, max_rel_l2, max_abs};
  }
  r.reference_device = *o.text("--reference");
  r.hot_l2 = o.flag("--hot-l2");
  r.time_preparation = o.flag("--time-preparation");
  if (const auto mib = o.integer("--prefetch-memory")) r.prefetch_bytes = static_cast<std::uint64_t>(*mib) << 20;
  r.timing = parsed(o, "--timing", parse_timing_method, timing_method_names());
  r.kernel_options.quant = quant_options_from(o);
  r.rerun_base = o.rerun_flags(kRunUse) + plugin_flags;
  return r;
}

bool wants_generated(const Options& o) {
  for (const char* flag : {"--shape", "--batch_size", "--num_qo_heads", "--s_qo", "--head_dim_qk", "--routine"}) {
    if (o.given(flag)) return true;
  }
  return false;
}

std::pair<GeneratedCallSpec, std::string> generated_spec(const Options& o) {
  GeneratedCallSpec spec;
  spec.shape = generated_shape(o);
  spec.dtype = parsed(o, "--dtype", parse_dtype, floating_dtype_names());
  spec.layout = parsed(o, "--layout", parse_layout, layout_names());
  spec.is_causal = o.flag("--causal");
  spec.causal_alignment = parsed(o, "--causal_alignment", parse_causal_alignment, causal_alignment_names());
  spec.scale = o.number("--scale");
  spec.seed = static_cast<std::uint64_t>(o.integer("--seed").value_or(0));
  const std::int64_t page_size = o.integer("--page_size").value_or(0);
  const bool random_lengths = o.flag("--random_actual_seq_len");
  if (o.given("--routine")) {
    spec.routine = parsed(o, "--routine", parse_batch_routine, batch_routine_names());
    spec.page_size = page_size;
    spec.random_actual_seq_len = random_lengths;
    spec.layout = Layout::thd;
    spec.causal_alignment = CausalAlignment::bottom_right;
  } else if (spec.layout == Layout::thd) {
    throw InputError("--layout thd: a ragged batch is generated by --routine");
  } else if (page_size || random_lengths) {
    throw InputError(fmt::format("{}: only a --routine generates sequences",
                                 page_size ? "--page_size" : "--random_actual_seq_len"));
  }
  return {spec, generated_call_flags(spec)};
}

std::pair<GeneratedCallSpec, std::string> generated_spec(const Options& o, const FlashInferDefinitionShape& definition) {
  using Kind = FlashInferDefinitionShape::Kind;
  GeneratedCallSpec spec;
  spec.shape = generated_shape(o);
  spec.shape.heads_q = definition.heads_q;
  spec.shape.heads_kv = definition.heads_kv;
  spec.shape.head_dim_qk = definition.head_dim_qk;
  spec.shape.head_dim_vo = definition.head_dim_vo;
  if (definition.kind == Kind::paged_decode) spec.shape.seq_q = 1;
  spec.dtype = definition.dtype;
  spec.layout = Layout::thd;
  // A dump's name says no causality (FlashInfer names it from the constant axes): --causal does.
  spec.is_causal = definition.causal || o.flag("--causal");
  spec.causal_alignment = CausalAlignment::bottom_right;
  spec.scale = o.number("--scale");
  spec.seed = static_cast<std::uint64_t>(o.integer("--seed").value_or(0));
  spec.routine = definition.kind == Kind::ragged_prefill  ? BatchRoutine::prefill_ragged
                 : definition.kind == Kind::paged_prefill ? BatchRoutine::prefill_paged
                                                          : BatchRoutine::decode_paged;
  spec.page_size = definition.page_size;
  spec.random_actual_seq_len = o.flag("--random_actual_seq_len");
  return {spec, generated_call_flags(spec)};
}

std::function<bool(std::int64_t)> parse_call_ranges(const std::string& text) {
  if (text.empty()) return {};
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  std::stringstream stream(text);
  for (std::string part; std::getline(stream, part, ',');) {
    const auto dash = part.find('-', 1);
    try {
      if (dash == std::string::npos) ranges.emplace_back(std::stoll(part), std::stoll(part));
      else ranges.emplace_back(std::stoll(part.substr(0, dash)), std::stoll(part.substr(dash + 1)));
    } catch (const std::exception&) {
      throw InputError(fmt::format("--calls: expected ranges like 0-40,55, got '{}'", text));
    }
  }
  return [ranges](std::int64_t index) {
    for (const auto& [low, high] : ranges)
      if (index >= low && index <= high) return true;
    return false;
  };
}

std::function<bool(std::int64_t)> wanted_calls(const Options& o) { return parse_call_ranges(o.text("--calls").value_or("")); }

}  // namespace attnreplay
