#include "replay/judge/attention_work.h"

#include "formats/mask_structure.h"

namespace attnreplay {

double attended_pairs(std::int64_t seq_q, std::int64_t seq_kv, bool causal, CausalAlignment alignment) {
  const auto sq = static_cast<double>(seq_q);
  const auto skv = static_cast<double>(seq_kv);
  if (!causal) return sq * skv;
  if (alignment == CausalAlignment::bottom_right) {
    // The last query row sees every key; with more queries than keys the first rows see none.
    return sq <= skv ? sq * (2 * skv - sq) / 2 : skv * skv / 2;
  }
  // Top-left: row i sees keys 0..i; with more queries than keys the later rows see all keys.
  return sq <= skv ? sq * sq / 2 : skv * (2 * sq - skv) / 2;
}

double visible_pairs(const MaskStructure& structure, const AttentionShape& s) {
  double pairs = 0;
  const std::int64_t heads = structure.heads == 1 ? 1 : s.heads_q;
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < s.seq_q; ++i) {
        const auto [first, end] = structure.row_keys(b, h, i);
        if (first >= end) continue;
        // The diagonal counts half where it bounds the row (the causal convention above).
        const bool cut = structure.upper && end == i + *structure.upper + 1;
        pairs += static_cast<double>(end - first) - (cut ? 0.5 : 0.0);
      }
  return structure.heads == 1 ? pairs * static_cast<double>(s.heads_q) : pairs;
}

AttentionWork attention_work(const AttentionShape& s, bool causal, CausalAlignment alignment, DType input_dtype,
                             DType output_dtype) {
  AttentionWork work;
  work.attended_pairs_per_head = attended_pairs(s.seq_q, s.seq_kv, causal, alignment);
  const double heads = static_cast<double>(s.batch) * static_cast<double>(s.heads_q);
  work.flops = 2.0 * heads * work.attended_pairs_per_head * static_cast<double>(s.head_dim_qk + s.head_dim_vo);
  const double in_size = static_cast<double>(dtype_size(input_dtype));
  const double b = static_cast<double>(s.batch);
  const double q = b * s.heads_q * s.seq_q * s.head_dim_qk;
  const double k = b * s.heads_kv * s.seq_kv * s.head_dim_qk;
  const double v = b * s.heads_kv * s.seq_kv * s.head_dim_vo;
  const double o = b * s.heads_q * s.seq_q * s.head_dim_vo;
  work.bytes = (q + k + v) * in_size + o * static_cast<double>(dtype_size(output_dtype));
  return work;
}

AttentionWork attention_work(const AttentionCall& call) {
  if (call.is_ragged()) {
    // Summed over the sequences, each as long as it is: the keys a sequence uses, not the rows or
    // pages stored (FlashInfer's benchmark counts the same way).
    const AttentionShape packed = call.shape();
    AttentionWork total;
    for (const AttentionCall::Sequence& sequence : call.sequences()) {
      AttentionShape one = packed;
      one.seq_q = sequence.q_len, one.seq_kv = sequence.k_len;
      const AttentionWork work = attention_work(one, call.is_causal, call.causal_alignment, call.q.dtype, call.q.dtype);
      total.flops += work.flops, total.bytes += work.bytes;
      total.attended_pairs_per_head += work.attended_pairs_per_head;
    }
    return total;
  }
  AttentionWork work = attention_work(call.shape(), call.is_causal, call.causal_alignment, call.q.dtype, call.q.dtype);
  if (call.mask) {
    // A mask read as structure counts the pairs it leaves, as a ragged batch counts its sequences'.
    const std::shared_ptr<const CallVisibility> visibility = visibility_of(call);
    if (!visibility->dense_mask) {
      const AttentionShape s = call.shape();
      const double pairs = visible_pairs(visibility->structure, s);
      work.attended_pairs_per_head = pairs / static_cast<double>(s.batch * s.heads_q);
      work.flops = 2.0 * pairs * static_cast<double>(s.head_dim_qk + s.head_dim_vo);
    }
  }
  return work;
}

}  // namespace attnreplay
