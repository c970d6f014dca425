#include "replay/call_semantics.h"

#include <fmt/format.h>

#include <map>
#include <set>

namespace attnreplay {
namespace {

// Arguments that leave the output as the record computes it, whatever their value: extra outputs,
// determinism, work splitting, length hints, dropout's random state (dropout is replayed as 0).
const std::set<std::string, std::less<>> kNeutral = {
    "return_softmax", "return_debug_mask", "return_attn_probs", "return_lse", "compute_log_sumexp",
    "compute_logsumexp", "deterministic", "num_splits", "pack_gqa", "sm_margin", "gen_", "generator",
    "out", "philox_seed", "philox_offset", "max_seqlen_q", "max_seqlen_k", "max_seqlen_kv", "max_seqlen", "scheduler_metadata",
    "is_rotary_interleaved", "zero_tensors"};

// Arguments that are neutral only at these values (as capture writes them), and what they do
// otherwise. Capture puts a window, softcap, ALiBi slopes, sinks and a ragged or paged batch's
// offsets, lengths and block table in the record's own fields (schema v2); they are here for
// captures made before that, which named them as arguments only, and for forms capture does not map.
struct Default {
  std::set<std::string, std::less<>> values;
  const char* meaning;
};
const std::map<std::string, Default, std::less<>>& defaults() {
  static const std::map<std::string, Default, std::less<>> table = {
      {"window_size_left", {{"-1", "None"}, "a sliding window"}},
      {"window_size_right", {{"-1", "None"}, "a sliding window"}},
      {"window_size", {{"-1,-1", "-1", "0", "None"}, "a sliding window"}},
      {"softcap", {{"0", "None"}, "a softcap on the scores"}},
      {"alibi_slopes", {{"None"}, "ALiBi biases"}},
      {"learnable_sink", {{"None"}, "attention sinks"}},
      {"sinks", {{"None"}, "attention sinks"}},
      {"attention_chunk", {{"0", "None"}, "chunked attention"}},
      {"cu_seqlens_q", {{"None"}, "a ragged (varlen) batch"}},
      {"cu_seqlens_k", {{"None"}, "a ragged (varlen) batch"}},
      {"seqstart_q", {{"None"}, "a ragged (varlen) batch"}},
      {"seqstart_k", {{"None"}, "a ragged (varlen) batch"}},
      {"seqused_q", {{"None"}, "per-sequence lengths"}},
      {"seqused_k", {{"None"}, "per-sequence lengths"}},
      {"seqlen_k", {{"None"}, "per-sequence lengths"}},
      {"cache_seqlens", {{"None"}, "per-sequence lengths"}},
      {"leftpad_k", {{"None"}, "left padding of the keys"}},
      {"block_table", {{"None"}, "a paged KV cache"}},
      {"page_table", {{"None"}, "a paged KV cache"}},
      {"cache_batch_idx", {{"None"}, "a KV cache indexed by batch"}},
      {"kv_batch_idx", {{"None"}, "a KV cache indexed by batch"}},
      {"cu_seqlens_k_new", {{"None"}, "keys appended to a KV cache"}},
      {"seqlens_rotary", {{"None"}, "rotary embedding inside the kernel"}},
      {"k_new", {{"None"}, "keys appended to a KV cache"}},
      {"v_new", {{"None"}, "values appended to a KV cache"}},
      {"rotary_cos", {{"None"}, "rotary embedding inside the kernel"}},
      {"rotary_sin", {{"None"}, "rotary embedding inside the kernel"}},
      {"q_descale", {{"None"}, "FP8 descaling factors"}},
      {"k_descale", {{"None"}, "FP8 descaling factors"}},
      {"v_descale", {{"None"}, "FP8 descaling factors"}},
      {"qv", {{"None"}, "an extra query-value product"}},
      {"q_v", {{"None"}, "an extra query-value product"}},
      {"custom_mask_type", {{"0"}, "a causal mask given as xformers' mask type"}},
      {"score_mod", {{"None"}, "a score modification"}},
      {"mask_mod", {{"None"}, "a mask function"}},
  };
  return table;
}

}  // namespace

std::vector<std::string> unreplayable_arguments(const AttentionCall& call) {
  std::vector<std::string> refused;
  constexpr std::string_view kPrefix = "arg.";
  for (const auto& [key, value] : call.metadata) {
    if (key.rfind(kPrefix, 0) != 0) continue;
    const std::string_view name = std::string_view(key).substr(kPrefix.size());
    if (kNeutral.count(name)) continue;
    const auto known = defaults().find(name);
    if (known == defaults().end()) {
      refused.push_back(fmt::format("{}={} (an argument the record does not know)", name, value));
    } else if (!known->second.values.count(value)) {
      refused.push_back(fmt::format("{}={} ({})", name, value, known->second.meaning));
    }
  }
  return refused;
}

}  // namespace attnreplay
