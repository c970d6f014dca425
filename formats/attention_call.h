#pragma once
// The one record of an attention call. Capture fills it, the formats store it, kernels run it
// and replay reports on it.
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "formats/attention_shape.h"
#include "formats/host_tensor.h"

namespace attnreplay {

struct CallVisibility;  // formats/mask_structure.h

// How the dims of Q, K, V and the output are ordered. SDPA takes BHSD; flash-attn's ops take BSHD.
// THD is a ragged or paged batch as flash-attn's varlen ops take it (docs/format.md): q and out are
// (total_q, heads, dim), the sequences' rows one after another; k and v are packed the same way,
// (total_k, heads_kv, dim), or are the pages of a KV cache, (pages, page_size, heads_kv, dim).
enum class Layout { bhsd, bshd, thd };
// Where the causal diagonal sits when s_q != s_kv: torch SDPA's is_causal is top-left,
// flash-attn (>= 2.1) is bottom-right. Equal lengths make them the same.
enum class CausalAlignment { top_left, bottom_right };

std::string_view layout_name(Layout layout);
std::optional<Layout> parse_layout(std::string_view text);
const std::vector<std::string>& layout_names();  // "bhsd", "bshd", "thd"
std::string_view causal_alignment_name(CausalAlignment alignment);
std::optional<CausalAlignment> parse_causal_alignment(std::string_view text);
const std::vector<std::string>& causal_alignment_names();


struct AttentionCall {
  std::int64_t call_index = 0;
  std::string op;       // the op the model called, e.g. "aten::scaled_dot_product_attention"
  std::string backend;  // the implementation that ran it, when known
  Layout layout = Layout::bhsd;
  HostTensor q, k, v;
  // Bool (true = may attend) or additive float, broadcastable to (batch, heads_q, seq_q, seq_kv).
  std::optional<HostTensor> mask;
  std::optional<HostTensor> out;  // the output the model got
  std::optional<double> scale;    // unset: 1/sqrt(head_dim_qk)
  bool is_causal = false;
  CausalAlignment causal_alignment = CausalAlignment::top_left;
  double dropout_p = 0.0;
  bool enable_gqa = false;
  // What flash-attn-style ops add to plain attention (docs/format.md). Positions are relative to
  // the causal diagonal, aligned as causal_alignment says: query i sits at key i + offset, where
  // offset is s_kv - s_q bottom-right and 0 top-left.
  // A sliding window: query i sees keys i + offset - window_left .. i + offset + window_right;
  // unset is unbounded on that side (flash-attn's -1).
  std::optional<std::int64_t> window_left, window_right;
  double softcap = 0.0;  // > 0: scores (scaled) become softcap * tanh(scores / softcap)
  // ALiBi: (heads_q) or (batch, heads_q) slopes; score -= slope * |i + offset - j|, after softcap.
  std::optional<HostTensor> alibi_slopes;
  // Attention sinks (gpt-oss, FA3's learnable_sink, vLLM's s_aux): (heads_q) logits that join each
  // row's softmax denominator and contribute no value.
  std::optional<HostTensor> sinks;
  // A ragged or paged batch (Layout::thd), in int32 or int64 as the op took them. Sequence b's
  // queries are q rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]; its keys are k rows cu_seqlens_k[b] ..
  // cu_seqlens_k[b+1] when k is packed, or the pages block_table[b, 0..] lists, in order, when k is
  // paged; seqused_k[b], where given (always with pages), says it uses only the first that many.
  // Causality, the window and ALiBi apply within each sequence, aligned as causal_alignment says.
  std::optional<HostTensor> cu_seqlens_q, cu_seqlens_k, seqused_k, block_table;
  std::map<std::string, std::string> metadata;  // model, step, layer, thread, call site, ...
  // Where the call was read from; used in messages and rerun commands, not stored.
  std::string source;
  // Which keys its rows see, as structure (formats/mask_structure.h): read once by the replay for the
  // kernels that take structure; not stored. Whoever changes the call's mask, shape or causality
  // clears it.
  std::shared_ptr<const CallVisibility> visibility;

  // "run.h5: call 17"
  std::string where() const;
  double softmax_scale() const;
  // Throws InputError naming the call and field when Q, K, V, mask or out disagree. A ragged
  // call's shape is its packed view: batch 1, seq_q its queries in all, seq_kv the key rows k
  // holds (pages times page size when paged); sequences() gives each sequence.
  AttentionShape shape() const;
  // The dims of a tensor named `field` in this call's layout as (batch, heads, seq, dim).
  std::array<std::int64_t, 4> bhsd_dims(const HostTensor& tensor, std::string_view field) const;
  // Where query i's diagonal sits among the keys: i + diagonal_offset (s_kv - s_q bottom-right).
  std::int64_t diagonal_offset(const AttentionShape& s) const;
  // The keys query i may see by causality and the window, [first, end) (empty when first >= end);
  // a mask may hide more.
  std::pair<std::int64_t, std::int64_t> visible_keys(std::int64_t i, const AttentionShape& s) const;
  // The ALiBi slope and the sink logit of (batch b, query head h); 0 and -inf when absent.
  double alibi_slope(std::int64_t b, std::int64_t h) const;
  double sink(std::int64_t h) const;
  // Every tensor of the call that is present, by its field name (q, k, v, mask, out,
  // alibi_slopes, sinks): what the formats store and what memory a call holds.
  std::vector<std::pair<std::string_view, const HostTensor*>> named_tensors() const;
  std::vector<std::pair<std::string_view, HostTensor*>> named_tensors();
  // The tensor field `name`, made present, for readers; null for an unknown name.
  HostTensor* tensor_field(std::string_view name);
  // What applies beyond plain masked, causal attention, and each in words ("a sliding window
  // (left 64)", "a softcap of 30"), as reports and refusals name them.
  enum class Extension { window, softcap, alibi, sinks };
  std::vector<Extension> extensions() const;
  std::string describe(Extension extension) const;

  // Ragged and paged batches (formats/ragged_call.cpp).
  bool is_ragged() const { return layout == Layout::thd; }
  bool is_paged() const { return is_ragged() && block_table.has_value(); }
  struct Sequence {
    std::int64_t q_begin = 0, q_len = 0;
    std::int64_t k_begin = 0, k_len = 0;  // k_begin: the first key row when k is packed
    bool operator==(const Sequence&) const = default;
  };
  // A ragged call's sequences, checked against q, k and each other (InputError naming the field);
  // they need the data of cu_seqlens, seqused_k and block_table.
  std::vector<Sequence> sequences() const;
  // Sequence b as a dense call (bshd, batch 1, bottom-right or top-left as the call): its queries,
  // the keys it uses (gathered from their pages), its output rows and its ALiBi slopes. Without
  // data, only the shapes: enough for a kernel to say whether it takes the call.
  AttentionCall sequence_call(std::size_t b, const std::vector<Sequence>& sequences, bool with_data = true) const;
  // "a ragged batch of 8 sequences (queries 1..512, keys 17..4096), paged (page size 16, 301
  // pages)", for reports; empty for a dense call.
  std::string describe_batch() const;
  // shape()'s checks of a ragged call's own fields (their shapes and dtypes; sequences() checks
  // their values); returns the number of sequences.
  std::int64_t check_ragged_fields() const;
};

// Returns `tensor` (one of q, k, v, out in `layout`) as a contiguous (b, h, s, d) tensor; a THD
// tensor (t, h, d) becomes (1, h, t, d), pages (p, page_size, h, d) become (1, h, p * page_size, d).
HostTensor to_bhsd(const HostTensor& tensor, Layout layout);

}  // namespace attnreplay
