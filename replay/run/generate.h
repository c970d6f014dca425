#pragma once
// Generated inputs for any shape: standard normal Q, K, V from a fixed seed, rounded to the dtype.
#include <cstdint>
#include <string>

#include "formats/attention_call.h"

namespace attnreplay {

// FlashInfer's benchmark routines (flashinfer_benchmark.py --routine) that generate a batch of
// sequences: packed (ragged) keys, or keys in pages of a KV cache. Their calls are thd
// (AttentionCall::is_ragged), causal bottom-right as FlashInfer aligns it.
enum class BatchRoutine { none, prefill_ragged, prefill_paged, decode_paged };
std::string_view batch_routine_name(BatchRoutine routine);  // "BatchDecodeWithPagedKVCacheWrapper", ...
std::optional<BatchRoutine> parse_batch_routine(std::string_view text);
const std::vector<std::string>& batch_routine_names();

struct GeneratedCallSpec {
  AttentionShape shape;
  DType dtype = DType::bfloat16;
  Layout layout = Layout::bhsd;
  bool is_causal = false;
  CausalAlignment causal_alignment = CausalAlignment::top_left;
  std::optional<double> scale;
  std::uint64_t seed = 0;
  // A batch routine: `shape.batch` sequences of shape.seq_q queries and shape.seq_kv keys, or, with
  // random_actual_seq_len, of keys drawn from 1..seq_kv and queries from 1..min(seq_q, its keys);
  // pages of page_size tokens, dealt to the sequences in a seeded random order.
  BatchRoutine routine = BatchRoutine::none;
  std::int64_t page_size = 0;
  bool random_actual_seq_len = false;
};

AttentionCall generate_call(const GeneratedCallSpec& spec);

// The `attnreplay run` flags that generate the same call ("--shape 1,2,64,32 --num_kv_heads 2 ...").
std::string generated_call_flags(const GeneratedCallSpec& spec);

}  // namespace attnreplay
