#include "formats/call_semantics.h"

#include <fmt/format.h>

#include <map>
#include <set>

namespace attnreplay {
namespace {

// Arguments that leave the output as the record computes it, whatever their value: extra outputs,
// determinism, work splitting, length hints, dropout's random state (dropout is replayed as 0).
const std::set<std::string, std::less<>> kNeutral = {
    "return_softmax", "return_debug_mask", "return_attn_probs", "return_lse", "compute_log_sumexp",
    "compute_logsumexp", "deterministic", "num_splits", "pack_gqa", "sm_margin", "gen_", "gen", "generator",
    "out", "philox_seed", "philox_offset", "max_seqlen_q", "max_seqlen_k", "max_seqlen_kv", "max_seqlen", "scheduler_metadata",
    "is_rotary_interleaved", "zero_tensors",
    // flash_attn_with_kvcache: keys and values written into the cache before attention, which capture
    // reads there afterwards (seqused_k counts them); the other two matter only with rotary_cos.
    "k_appended", "v_appended", "rotary_interleaved", "return_softmax_lse",
    // FlashInfer: buffers, dtypes and sizes its wrappers plan with (the tensors carry the same),
    // scheduling and launch options; RoPE's parameters matter only with pos_encoding_mode.
    "float_workspace_buffer", "use_cuda_graph", "use_tensor_cores", "paged_kv_indptr_buffer",
    "paged_kv_indices_buffer", "paged_kv_last_page_len_buffer", "paged_kv_indptr_buf", "paged_kv_indices_buf",
    "paged_kv_last_page_len_buf", "qo_indptr_buf", "custom_mask_buf",
    "mask_indptr_buf", "kv_indptr_buf", "kv_indices_buf", "kv_last_page_len_buf", "backend", "num_qo_heads",
    "num_kv_heads", "head_dim", "head_dim_qk", "head_dim_vo", "page_size", "q_data_type", "kv_data_type", "o_data_type",
    "o_dtype",
    "data_type", "non_blocking", "enable_pdl", "lse", "fixed_split_size", "disable_split_kv",
    "max_token_per_sequence", "max_sequence_kv", "rope_scale", "rope_theta",
    // FlashInfer's MLA wrapper: sizes, and its profiler and log-sum-exp options.
    "num_heads", "head_dim_ckv", "head_dim_kpe", "use_profiler", "profiler_buffer", "return_lse_base_on_e"};

// Arguments that are neutral only at these values (as capture writes them), and what they do
// otherwise. Capture puts a window, softcap, ALiBi slopes, sinks and a ragged or paged batch's
// offsets, lengths and block table in the record's own fields (schema v2); they are here for
// captures made before that, which named them as arguments only, and for forms capture does not map.
struct Default {
  std::set<std::string, std::less<>> values;
  const char* meaning;
};
const std::map<std::string, Default, std::less<>> kDefaults = {
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
      {"paged_kv_indptr", {{"None"}, "a paged KV cache"}},
      {"paged_kv_indices", {{"None"}, "a paged KV cache"}},
      {"paged_kv_last_page_len", {{"None"}, "a paged KV cache"}},
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
      // flash_attn_with_kvcache's names.
      {"cache_leftpad", {{"None"}, "left padding of the keys"}},
      // FlashInfer's names.
      {"pos_encoding_mode", {{"NONE"}, "a positional encoding inside the kernel"}},
      {"custom_mask", {{"None"}, "a custom mask"}},
      {"packed_custom_mask", {{"None"}, "a custom mask"}},
      {"use_fp16_qk_reduction", {{"False"}, "Q·K accumulated in fp16"}},
      {"use_fp16_softmax", {{"None", "False"}, "the softmax in fp16"}},
      {"q_scale", {{"None"}, "FP8 scales"}},
      {"k_scale", {{"None"}, "FP8 scales"}},
      {"v_scale", {{"None"}, "FP8 scales"}},
      {"o_scale", {{"None"}, "FP8 scales"}},
      {"scale_q", {{"None"}, "FP8 scales"}},
      {"scale_k", {{"None"}, "FP8 scales"}},
      {"scale_v", {{"None"}, "FP8 scales"}},
      {"kv_cache_sf", {{"None"}, "NVFP4 scale factors"}},
      {"skip_softmax_threshold_scale_factor", {{"None"}, "skipping of small softmax blocks"}},
      {"uses_spcompress", {{"None", "False"}, "a compressed KV cache"}},
      {"q_len_per_req", {{"None", "1"}, "several queries a request in decode"}},
      {"jit_args", {{"None"}, "a custom attention variant"}},
      {"jit_kwargs", {{"None"}, "a custom attention variant"}},
      {"prefix_len_ptr", {{"None"}, "multi-item scoring"}},
      {"token_pos_in_items_ptr", {{"None"}, "multi-item scoring"}},
      {"token_pos_in_items_len", {{"0"}, "multi-item scoring"}},
      {"max_item_len_ptr", {{"None"}, "multi-item scoring"}},
      {"seq_lens", {{"None"}, "per-sequence lengths given apart from the pages"}},
      {"seq_lens_q", {{"None"}, "per-sequence lengths given apart from the offsets"}},
      {"block_tables", {{"None"}, "a block table given apart from the pages"}},
      {"v_indptr", {{"None"}, "values packed apart from the keys"}},
      {"o_indptr", {{"None"}, "outputs packed apart from the queries"}},
      {"ckv_scale", {{"None"}, "FP8 scales"}},
      {"ckv_scale_arr", {{"None"}, "FP8 scales"}},
      {"kpe_scale", {{"None"}, "FP8 scales"}},
      {"kv_len", {{"None"}, "per-sequence lengths given at run"}},
      // vLLM's builds of flash-attn: fwd_kvcache's appended keys and values (its cache is kcache and
      // vcache), and FA3's context parallelism.
      {"k", {{"None"}, "keys appended to a KV cache"}},
      {"v", {{"None"}, "values appended to a KV cache"}},
      {"cp_world_size", {{"1"}, "context parallelism"}},
      {"cp_rank", {{"0"}, "context parallelism"}},
      {"cp_tot_seqused_k", {{"None"}, "context parallelism"}},
      // SGLang's build of FlashAttention-3 (sgl_kernel::fwd).
      {"sparse_mask_fine", {{"None"}, "a block-sparse mask"}},
};

// Arguments a kernel reads only together with another: without it they change nothing. SGLang's
// FlashAttention-3 backend passes cu_seqlens_k_new on every prefill, k_new never (it writes the
// cache first); FlashAttention-3's mha_fwd reads the offsets only where k_new is given.
const std::map<std::string, std::string, std::less<>> kReadOnlyWith = {
    {"cu_seqlens_k_new", "k_new"},
};

bool unused_without_partner(const AttentionCall& call, std::string_view name) {
  const auto partner = kReadOnlyWith.find(name);
  if (partner == kReadOnlyWith.end()) return false;
  const auto value = call.metadata.find("arg." + partner->second);
  // Present and None: an op whose partner is absent, or mapped elsewhere, is not judged by this rule.
  return value != call.metadata.end() && value->second == "None";
}

}  // namespace

std::vector<std::string> unreplayable_arguments(const AttentionCall& call) {
  std::vector<std::string> refused;
  constexpr std::string_view kPrefix = "arg.";
  for (const auto& [key, value] : call.metadata) {
    if (key.rfind(kPrefix, 0) != 0) continue;
    const std::string_view name = std::string_view(key).substr(kPrefix.size());
    if (kNeutral.count(name) || unused_without_partner(call, name)) continue;
    const auto known = kDefaults.find(name);
    if (known == kDefaults.end()) {
      refused.push_back(fmt::format("{}={} (an argument the record does not know)", name, value));
    } else if (!known->second.values.count(value)) {
      refused.push_back(fmt::format("{}={} ({})", name, value, known->second.meaning));
    }
  }
  return refused;
}

}  // namespace attnreplay
