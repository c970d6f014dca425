#pragma once
// Which keys each query row of a call sees, as structure: a key range per (batch[, head]) (padding
// on either side), a diagonal on either side of the row (causality at any offset, a sliding
// window), or packed documents (block-diagonal). Almost every mask a model passes is one of these;
// FlashAttention, FlashInfer and flex_attention run them as such, never as a dense tensor, and so do
// our kernels (docs/masks.md). A mask is read as structure only where the structure rebuilds it
// exactly, row by row; any other mask stays dense.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "formats/attention_call.h"
#include "formats/attention_shape.h"

namespace attnreplay {

struct MaskStructure {
  // Query rows [q_begin, q_end) see keys [k_begin, k_end) of their own document only.
  struct Document {
    std::int64_t q_begin = 0, q_end = 0, k_begin = 0, k_end = 0;
    bool operator==(const Document& o) const {
      return q_begin == o.q_begin && q_end == o.q_end && k_begin == o.k_begin && k_end == o.k_end;
    }
  };

  std::int64_t batch = 0;
  // 1 when every head's rows see the same keys; else heads_q, a group per (batch, head).
  std::int64_t heads = 1;
  std::int64_t seq_q = 0, seq_kv = 0;
  // Per group (b * heads + h): the keys any of its rows may see, [key_begin, key_end), and the rows
  // that see any, [row_begin, row_end) (padded queries; rows outside see no key).
  std::vector<std::int64_t> key_begin, key_end, row_begin, row_end;
  // Row i sees keys j <= i + upper (causality; upper = s_kv - s_q bottom-right, 0 top-left) and
  // j >= i + lower (a sliding window's left edge).
  std::optional<std::int64_t> upper, lower;
  // Per group, its documents in row order; empty: none. A row inside no document sees no key.
  std::vector<std::vector<Document>> documents;

  bool operator==(const MaskStructure&) const = default;
  // Every key of every row: no mask at all.
  static MaskStructure all_visible(const AttentionShape& shape);
  // Whether every row of every (batch, head) sees every key: no mask, or one that hides nothing
  // (a causal diagonal at or past the last key for the first row, as in a decode step).
  bool every_row_sees_every_key() const;
  std::size_t group(std::int64_t b, std::int64_t h) const {
    return static_cast<std::size_t>(b * heads + (heads == 1 ? 0 : h));
  }
  // The keys row i of (b, h) sees, [first, end); first >= end when none.
  std::pair<std::int64_t, std::int64_t> row_keys(std::int64_t b, std::int64_t h, std::int64_t i) const;
  // In words, for reports: "causal (bottom-right) + left padding, keys from 0/37/120/300".
  std::string describe() const;
  // This and the diagonals given at once (each side the tighter of the two).
  MaskStructure with_diagonals(std::optional<std::int64_t> upper, std::optional<std::int64_t> lower) const;
};

// What a dense mask was found to be: its structure where that rebuilds it exactly, else why not.
struct MaskReading {
  std::optional<MaskStructure> structure;
  std::string dense_reason;  // "query row 3 of batch 0 sees keys that are not one range", ...
};

// Reads `mask` (bool: true = may attend; or additive float) broadcast as torch broadcasts it to
// (batch, heads_q, seq_q, seq_kv). An additive mask is structure only where it holds 0 and values
// that hide a key: -inf, or a value at or below kHidingAddend in a row that also sees a key (there
// exp() of it is 0 in every precision; a row of such values alone is a uniform average, not empty).
MaskReading read_mask_structure(const HostTensor& mask, const AttentionShape& shape);
inline constexpr double kHidingAddend = -1e4;

// What a dense call's rows see (a ragged call's sequences each are one), as the kernels that take structure want it: the call's own causality and
// window, and its mask where the mask is structure; `dense_mask` says the mask must still be applied
// element by element (it is not structure). Cached on the call (AttentionCall::visibility) when the
// replay has read it; computed here otherwise.
struct CallVisibility {
  MaskStructure structure;
  bool dense_mask = false;
  // What the mask was found to be, in words; empty without a mask, or with one whose values are not
  // at hand (a header), which counts as dense.
  std::string mask_found;
};
CallVisibility read_call_visibility(const AttentionCall& call);
// The same from its mask's reading, made before (a mask shared by many calls, read once).
CallVisibility call_visibility_with(const AttentionCall& call, const std::optional<MaskReading>& mask);
std::shared_ptr<const CallVisibility> visibility_of(const AttentionCall& call);

// A dense call whose mask is structure of key ranges (one group per batch entry, no documents) as
// one dense call per batch entry: the rows that may see keys and the keys they may see, without a
// mask, in bhsd, their diagonals moved with them (each part's visibility is set). What a kernel
// that takes diagonals but no key ranges runs (kernels/per_sequence.h). Nullopt where the call is
// not of that form, or its ALiBi would not survive the shift of positions. Without data, shapes
// only.
struct SequencePart {
  std::int64_t sequence = 0;  // its index: the batch entry, or a ragged call's sequence
  std::int64_t batch = 0, first_row = 0, rows = 0;  // where its rows go in the call's output
  std::int64_t first_key = 0, keys = 0;  // its keys in the call's; none: its rows are 0, `call` shapes only
  AttentionCall call;     // batch 1
};
std::optional<std::vector<SequencePart>> split_by_key_ranges(const AttentionCall& call, bool with_data = true);
// Whether split_by_key_ranges splits `call`, without making its parts.
bool splits_by_key_ranges(const AttentionCall& call);

}  // namespace attnreplay
