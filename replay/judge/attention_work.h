#pragma once
// The one place FLOPs and bytes of an attention call are counted. Every figure attnreplay prints
// (TFLOP/s, GB/s, arithmetic intensity) comes from here; docs/metrics.md states the conventions.
#include "formats/attention_call.h"

namespace attnreplay {

struct MaskStructure;  // formats/mask_structure.h

struct AttentionWork {
  double flops = 0;  // 2 * b * h_q * attended_pairs * (d_qk + d_vo)
  double bytes = 0;  // Q, K, V read and O written once, at their element sizes
  double attended_pairs_per_head = 0;

  double arithmetic_intensity() const { return bytes > 0 ? flops / bytes : 0.0; }
  double tflops(double seconds) const { return seconds > 0 ? flops / seconds / 1e12 : 0.0; }
  double gbytes_per_s(double seconds) const { return seconds > 0 ? bytes / seconds / 1e9 : 0.0; }
};

// (query, key) pairs a head attends to. Causal follows the peers' convention (FlashInfer, FA):
// the diagonal counts half, so a square causal call is exactly half of the full one.
double attended_pairs(std::int64_t seq_q, std::int64_t seq_kv, bool causal, CausalAlignment alignment);

// (query, key) pairs a structured mask leaves visible, over every (batch, head): the diagonal that
// bounds a row counts half, as above, so that a causal mask counts as is_causal does.
double visible_pairs(const MaskStructure& structure, const AttentionShape& shape);

AttentionWork attention_work(const AttentionShape& shape, bool causal, CausalAlignment alignment,
                             DType input_dtype, DType output_dtype);
// A ragged call's work is its sequences' summed (attended_pairs_per_head too); a dense call's with a
// mask read as structure, the pairs it leaves (visible_pairs).
AttentionWork attention_work(const AttentionCall& call);

}  // namespace attnreplay
