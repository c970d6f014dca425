#include "replay/cli/options.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <stdexcept>

#include "formats/attention_call.h"
#include "formats/dtype.h"
#include "kernels/quantized_attention.h"
#include "replay/measure/stopping_rule.h"
#include "replay/measure/timers.h"
#include "replay/run/generate.h"
#include "replay/run/rerun.h"

namespace attnreplay {
namespace {

const std::vector<std::string>& reference_devices() {
  static const std::vector<std::string> names{"cpu", "cuda", "auto"};
  return names;
}

std::string canonical_dtype(const std::string& text) {
  const auto dtype = parse_dtype(text);
  return dtype ? std::string(dtype_name(*dtype)) : text;
}

constexpr unsigned kRunLine = kRunUse | kTestlistLineUse;
constexpr unsigned kRunAuditLine = kRunUse | kAuditUse | kTestlistLineUse;
constexpr unsigned kPluginUses = kRunUse | kAuditUse | kKernelsUse;

// The --help sections.
const char* const generated = "Generated inputs";
const char* const selection = "Calls and kernels";
const char* const refcheck = "Thresholds";
const char* const stopping = "Stopping rule";
const char* const device = "Device and timing";
const char* const quant = "Quantized kernels";
const char* const output = "Output";
const char* const sharing = "Many processes";
const char* const plugins = "Plug-ins";
const char* const audit = "Audit";
using K = OptionKind;

const std::vector<OptionSpec> kTable = {
    {"--shape", K::text, "batch,heads,seq,head_dim (e.g. 2,24,4250,64)", generated, kRunLine},
    {"--batch_size", K::integer, "batch (overrides --shape)", generated, kRunLine},
    {"--num_qo_heads", K::integer, "query heads", generated, kRunLine},
    {"--num_kv_heads", K::integer, "key/value heads (GQA when fewer)", generated, kRunLine},
    {"--s_qo", K::integer, "query length", generated, kRunLine},
    {"--s_kv", K::integer, "key/value length", generated, kRunLine},
    {"--head_dim_qk", K::integer, "head dim of Q and K", generated, kRunLine},
    {"--head_dim_vo", K::integer, "head dim of V and O", generated, kRunLine},
    {"--dtype", K::text, "bf16, fp16, fp32, fp64, fp8", generated, kRunLine, Rerun::never, "bfloat16", nullptr,
     ValueCheck::none, canonical_dtype},
    {"--layout", K::text, "bhsd or bshd", generated, kRunLine, Rerun::never, "bhsd"},
    {"--causal", K::flag, "causal", generated, kRunLine},
    {"--causal_alignment", K::text, "top_left (SDPA) or bottom_right (flash-attn)", generated, kRunLine,
     Rerun::never, "top_left", causal_alignment_names},
    {"--scale", K::number, "softmax scale (default 1/sqrt(head_dim_qk))", generated, kRunLine},
    {"--routine", K::text,
     "a batch of sequences as FlashInfer's benchmark routine makes it (--batch_size sequences, causal "
     "bottom-right)",
     generated, kRunLine, Rerun::never, "", batch_routine_names},
    {"--page_size", K::integer, "tokens per KV-cache page (the paged routines)", generated, kRunLine,
     Rerun::never, "0"},
    {"--random_actual_seq_len", K::flag,
     "each sequence's keys drawn from 1..s_kv and its queries from 1..min(s_qo, its keys)", generated, kRunLine},

    // Rows that sample query rows carry their seed per call (replay/run/rerun.h).
    {"--seed,--random_seed", K::integer, "seed for generated inputs and sampled rows", selection, kRunAuditLine,
     Rerun::never, "0"},
    {"--kernels,--backends", K::list, "kernels to run, comma-separated, or all (cpu, gpu: each device's)",
     selection, kRunAuditLine, Rerun::never, "all"},
    {"--calls", K::text, "call indices to replay, e.g. 0-40,55", selection, kRunAuditLine},
    {"--ref-sample-rows", K::integer,
     "compare only this many random query rows per head (0: all); the full reference is then skipped", selection,
     kRunAuditLine, Rerun::when_set, "0"},

    {"--refcheck", K::flag, "judge errors against thresholds; exit 3 when one is exceeded", refcheck,
     kRunAuditLine, Rerun::when_set},
    {"--refcheck-min-cosine", K::number, "threshold (implies --refcheck)", refcheck, kRunAuditLine,
     Rerun::when_set},
    {"--refcheck-max-rel-l2", K::number, "threshold (implies --refcheck)", refcheck, kRunAuditLine,
     Rerun::when_set},
    {"--refcheck-max-abs", K::number, "threshold (implies --refcheck)", refcheck, kRunAuditLine, Rerun::when_set},

    {"--stopping", K::text,
     "when sampling stops: precision (once the median is known to --precision) or stdrel (nvbench's rule: "
     "--min-time, then --max-noise)",
     stopping, kRunAuditLine, Rerun::when_set, "precision", stopping_criterion_names},
    {"--precision", K::number,
     "precision: stop once the median's 95% confidence interval is within this percentage of it (CPU 5, GPU 0.5)",
     stopping, kRunAuditLine, Rerun::when_set},
    {"--warmup", K::integer, "warm-up runs (CPU 1, GPU 3)", stopping, kRunAuditLine, Rerun::when_set},
    {"--min-samples", K::integer, "fewest timed samples (CPU 5, GPU 10)", stopping, kRunAuditLine,
     Rerun::when_set},
    {"--min-time", K::number,
     "least seconds of timed samples (precision: CPU 0.02, GPU 0.01; stdrel: CPU 0.1, GPU 0.5)", stopping,
     kRunAuditLine, Rerun::when_set},
    {"--timeout", K::number, "most seconds of sampling per call and kernel (CPU 2, stdrel's 5; GPU 15)", stopping,
     kRunAuditLine, Rerun::when_set},
    {"--max-noise", K::number,
     "stdrel: stop once the samples' robust spread (1.4826 MAD / median) is under this percentage, or the "
     "median's standard error under a tenth of it (CPU 2, GPU 0.5)",
     stopping, kRunAuditLine, Rerun::when_set},
    {"--timed-calls-per-group", K::integer,
     "calls whose timing cannot differ (same shape, dtypes, layout, strides, mask, causality) share one: this "
     "many of each group are timed, the others judged only",
     stopping, kRunAuditLine, Rerun::never, "1", nullptr, ValueCheck::positive},
    {"--time-every-call", K::flag, "time every call, however many share a shape", stopping, kRunAuditLine},

    {"--reference", K::text, "where the fp64 reference runs: cpu, cuda, or auto (the GPU if present)", device,
     kRunAuditLine, Rerun::when_set, "auto", reference_devices},
    {"--hot-l2", K::flag, "GPU samples without flushing the L2 cache first (default: cold L2)", device,
     kRunAuditLine, Rerun::when_set},
    {"--time-preparation", K::flag,
     "also time a kernel's input preparation by itself, beside the kernel alone and the whole call (a third "
     "timing), for its ratio to the least it must cost",
     device, kRunAuditLine, Rerun::when_set},
    {"--prefetch-memory", K::integer,
     "MiB that calls read ahead of the one replayed may hold, it included (default: 4096, or a quarter of the "
     "memory where less)",
     device, kRunAuditLine, Rerun::never, "", nullptr, ValueCheck::positive},
    {"--timing", K::text,
     "how GPU kernels are timed: event (CUDA events around each run), graph (CUDA graph of K runs, hot L2), "
     "cupti (kernel durations CUPTI records), queued (events around runs queued back to back, unheld: "
     "triton's do_bench method)",
     device, kRunAuditLine, Rerun::when_set, "event", timing_method_names},

    {"--quant_gran", K::text, "rows sharing an INT8 scale (Sage)", quant, kRunAuditLine, Rerun::when_set,
     "per_warp", quant_granularity_names},
    {"--no_k_smooth", K::flag, "do not subtract K's channel means (Sage)", quant, kRunAuditLine,
     Rerun::when_set},
    {"--pv_accum_dtype", K::text, "Sage2's P·V accumulation", quant, kRunAuditLine, Rerun::when_set,
     "fp32+fp32", pv_accum_names},
    {"--fp8_scale", K::text, "FA3-FP8's scale granularity", quant, kRunAuditLine, Rerun::when_set, "per_head",
     fp8_scale_names},

    {"--case_tag", K::text, "a label carried into every row", output, kRunLine},
    {"--save-outputs", K::text, "folder for each kernel's output (.pt per call and kernel)", output, kRunLine},
    {"--save-inputs", K::text, "write the replayed calls to this capture (.h5, .pt or folder/)", output,
     kRunLine},
    {"--testlist", K::text, "file of run flags, one configuration a line (# comments)", output, kRunUse},
    {"--json", K::text, "write the complete results record", output, kRunUse | kAuditUse},
    {"--csv", K::text, "write one row per call and kernel", output, kRunUse | kAuditUse},
    {"--html", K::text, "write the results as one self-contained HTML page (as attnreplay report does)", output,
     kRunUse | kAuditUse},
    {"--fib-traces", K::text,
     "write FlashInfer-Bench traces (JSONL, one per workload and kernel) of the calls read from a FlashInfer-Trace "
     "folder; --baseline's time is their reference latency (docs/format.md)",
     output, kRunUse},
    {"-q,--quiet", K::flag, "print only the summary", output, kRunUse | kAuditUse},
    {"-v,--verbose", K::flag, "every kernel in each call's table, those that refused it included", output, kRunUse},
    {"--baseline", K::text, "the kernel the closing summary's times are relative to (default: the fastest exact one)",
     output, kRunUse},
    {"--no-ceilings", K::flag, "skip measuring the GPU's matrix and copy ceilings at start-up", output, kRunUse},

    {"--gpus", K::integer,
     "start this many processes, one per GPU of this machine, each replaying its share; rank 0 joins the parts "
     "(no launcher needed; docs/scaling.md)",
     sharing, kRunUse, Rerun::never, "1", nullptr, ValueCheck::positive},
    {"--shard", K::text,
     "share the calls among processes: auto (the launcher's ranks: torchrun, srun, mpirun, Slurm arrays), none, "
     "or RANK/SIZE; each writes its part of --json/--csv (docs/scaling.md)",
     sharing, kRunUse, Rerun::never, "auto"},
    {"--merge-wait", K::number,
     "sharded: seconds rank 0 waits for the other parts to join them (default: twice its own time plus 60; 0: "
     "leave them to attnreplay merge)",
     sharing, kRunUse, Rerun::never, "", nullptr, ValueCheck::non_negative},

    // The loaded plug-ins' flags, those of $ATTNREPLAY_KERNEL_MODULES too, go into every rerun
    // (replay/cli/plugin_loading.h).
    {"--kernel-module", K::repeated,
     "a Python file or module of plug-in kernels (docs/plugins.md); repeatable; also "
     "$ATTNREPLAY_KERNEL_MODULES, ':'-separated",
     plugins, kPluginUses},
    {"--kernel-library", K::repeated,
     "a shared library of C++/CUDA plug-in kernels (docs/plugins.md); repeatable; also "
     "$ATTNREPLAY_KERNEL_LIBRARIES",
     plugins, kPluginUses},

    {"--worst", K::integer, "worst calls (by rel_l2) listed per kernel, with per-head errors", audit, kAuditUse,
     Rerun::never, "5", nullptr, ValueCheck::non_negative},
    {"--random-compare", K::flag,
     "also run the kernels on random inputs of each captured shape, beside the captured calls' errors", audit,
     kAuditUse},
    {"--random-seeds", K::integer,
     "random calls per shape for --random-compare (seeds --seed, --seed + 1, ...): their median and range",
     audit, kAuditUse, Rerun::never, "3", nullptr, ValueCheck::positive},
    {"--attribute", K::flag,
     "for the worst calls of the emulated quantized kernels: the error with each quantization step, and input "
     "diagnostics (K channel means, INT8 amax spread) for every call",
     audit, kAuditUse},
    {"--full-timing", K::flag, "time with run's stopping rule (default: a quick one, a few samples)", audit,
     kAuditUse, Rerun::when_set},
    {"--cast-inputs", K::text,
     "round captured Q, K, V to this dtype first (bf16, fp16), as a model run in it would give them", audit,
     kAuditUse, Rerun::when_set, "", nullptr, ValueCheck::none, canonical_dtype},
};

std::string first_long_name(const std::string& names) {
  std::size_t start = 0;
  while (start < names.size()) {
    const std::size_t end = std::min(names.find(',', start), names.size());
    std::string name = names.substr(start, end - start);
    if (name.rfind("--", 0) == 0) return name;
    start = end + 1;
  }
  throw std::logic_error(fmt::format("option '{}' has no long name", names));
}

}  // namespace

std::string OptionSpec::flag() const { return first_long_name(names); }

std::string OptionSpec::key() const {
  std::string key = flag().substr(2);
  for (char& c : key)
    if (c == '-') c = '_';
  return key;
}

const std::vector<OptionSpec>& option_table() { return kTable; }

void Options::define(CLI::App& app, OptionUse use, const std::vector<OptionSpec>& table) {
  for (const OptionSpec& spec : table) {
    if (!(spec.uses & use)) continue;
    const std::string flag = spec.flag();
    Value& value = values_[flag];
    value.spec = &spec;
    order_.push_back(flag);
    CLI::Option* option = nullptr;
    switch (spec.kind) {
      case OptionKind::flag: option = app.add_flag(spec.names, value.present, spec.help); break;
      case OptionKind::list:
        option = app.add_option(spec.names, value.items, spec.help)->delimiter(',');
        break;
      case OptionKind::repeated: option = app.add_option(spec.names, value.items, spec.help); break;
      case OptionKind::integer:
        option = app.add_option(spec.names, value.text, spec.help)->type_name("INT");
        option->check(CLI::TypeValidator<std::int64_t>(""));
        break;
      case OptionKind::number:
        option = app.add_option(spec.names, value.text, spec.help)->type_name("FLOAT");
        option->check(CLI::TypeValidator<double>(""));
        break;
      case OptionKind::text: option = app.add_option(spec.names, value.text, spec.help); break;
    }
    if (spec.choices) option->check(CLI::IsMember(spec.choices()));
    // CLI11's own range checks print the range as "0 to 1.8e308" written out in full.
    const auto at_least = [](double low, bool inclusive, const char* expected) {
      return CLI::Validator(
          [=](const std::string& text) -> std::string {
            double value = 0;
            if (!CLI::detail::lexical_cast(text, value) || value < low || (!inclusive && value == low)) {
              return fmt::format("expected {}, got '{}'", expected, text);
            }
            return {};
          },
          expected);
    };
    if (spec.check == ValueCheck::positive) option->check(at_least(0, false, "a number above 0"));
    if (spec.check == ValueCheck::non_negative) option->check(at_least(0, true, "a number of 0 or more"));
    if (!spec.default_value.empty()) option->default_str(spec.default_value);
    option->group(spec.group);
    value.option = option;
  }
}

const Options::Value& Options::value(std::string_view flag) const {
  const auto found = values_.find(flag);
  if (found == values_.end()) throw std::logic_error(fmt::format("no option {} is defined here", flag));
  return found->second;
}

bool Options::given(std::string_view flag) const {
  const Value& v = value(flag);
  return v.option && v.option->count() > 0;
}

bool Options::flag(std::string_view flag) const { return value(flag).present; }

std::optional<std::string> Options::text(std::string_view flag) const {
  const Value& v = value(flag);
  if (given(flag)) return v.text;
  if (!v.spec->default_value.empty()) return v.spec->default_value;
  return std::nullopt;
}

std::optional<std::int64_t> Options::integer(std::string_view flag) const {
  const auto text = this->text(flag);
  if (!text) return std::nullopt;
  return std::stoll(*text);  // the parser checked it
}

std::optional<double> Options::number(std::string_view flag) const {
  const auto text = this->text(flag);
  if (!text) return std::nullopt;
  return std::stod(*text);
}

std::vector<std::string> Options::list(std::string_view flag) const {
  const Value& v = value(flag);
  if (given(flag) || v.spec->default_value.empty()) return v.items;
  std::vector<std::string> items;
  for (std::size_t start = 0; start <= v.spec->default_value.size();) {
    const std::size_t end = std::min(v.spec->default_value.find(',', start), v.spec->default_value.size());
    items.push_back(v.spec->default_value.substr(start, end - start));
    start = end + 1;
  }
  return items;
}

void Options::set(std::string_view flag, const std::string& text) {
  auto found = values_.find(flag);
  if (found == values_.end()) throw std::logic_error(fmt::format("no option {} is defined here", flag));
  Value& v = found->second;
  if (v.spec->kind == OptionKind::flag) throw std::logic_error(fmt::format("{} is a flag", flag));
  v.text = text;
  v.option->add_result(text);
}

std::vector<std::string> Options::values_of(const Value& v) const {
  const OptionSpec& spec = *v.spec;
  std::vector<std::string> values;
  if (spec.kind == OptionKind::list || spec.kind == OptionKind::repeated) {
    values = list(spec.flag());
  } else if (const auto text = this->text(spec.flag())) {
    values.push_back(*text);
  }
  if (spec.canonical)
    for (std::string& item : values) item = spec.canonical(item);
  return values;
}

nlohmann::json Options::to_json() const {
  nlohmann::json json = nlohmann::json::object();
  for (const std::string& flag : order_) {
    const Value& v = values_.at(flag);
    const std::vector<std::string> values = values_of(v);
    nlohmann::json& entry = json[v.spec->key()];
    switch (v.spec->kind) {
      case OptionKind::flag: entry = v.present; break;
      case OptionKind::list:
      case OptionKind::repeated: entry = values; break;
      case OptionKind::integer: entry = values.empty() ? nlohmann::json() : nlohmann::json(std::stoll(values[0])); break;
      case OptionKind::number: entry = values.empty() ? nlohmann::json() : nlohmann::json(std::stod(values[0])); break;
      case OptionKind::text: entry = values.empty() ? nlohmann::json() : nlohmann::json(values[0]); break;
    }
  }
  return json;
}

std::string Options::rerun_flags(unsigned include, unsigned exclude) const {
  std::string flags;
  for (const std::string& flag : order_) {
    const Value& v = values_.at(flag);
    const OptionSpec& spec = *v.spec;
    if (spec.rerun == Rerun::never || !(spec.uses & include) || (spec.uses & exclude)) continue;
    if (spec.kind == OptionKind::flag) {
      if (v.present) flags += " " + flag;
      continue;
    }
    if (!given(flag)) continue;
    const std::vector<std::string> values = values_of(v);
    const std::string defaulted = spec.canonical ? spec.canonical(spec.default_value) : spec.default_value;
    if (spec.kind == OptionKind::repeated) {
      for (const std::string& item : values) flags += fmt::format(" {} {}", flag, shell_quote(item));
    } else if (spec.kind == OptionKind::list) {
      if (fmt::format("{}", fmt::join(values, ",")) != defaulted) {
        flags += fmt::format(" {} {}", flag, shell_quote(fmt::format("{}", fmt::join(values, ","))));
      }
    } else if (values.front() != defaulted) {
      flags += fmt::format(" {} {}", flag, shell_quote(values.front()));
    }
  }
  return flags;
}

}  // namespace attnreplay
