#pragma once
// Inside formats/: a mask as the keys each of its rows sees, which the host (mask_structure.cpp)
// or torch, where the mask lies (mask_structure_torch.cpp), reads, and the one fitting of structure
// to those rows that both share, with the reasons a mask stays dense in the same words.
#include <cstdint>
#include <string>
#include <vector>

#include "formats/attention_shape.h"
#include "formats/mask_structure.h"

namespace attnreplay::mask_rows {

// The keys one row sees, [lo, hi); lo == hi == 0 when none.
struct RowRange {
  std::int64_t lo = 0, hi = 0;
  bool empty() const { return lo >= hi; }
  bool operator==(const RowRange&) const = default;
};

struct MaskRows {
  std::int64_t groups = 0, heads = 1, seq_q = 0;
  std::vector<RowRange> rows;  // (groups, seq_q)
  const RowRange& at(std::int64_t g, std::int64_t i) const { return rows[static_cast<std::size_t>(g * seq_q + i)]; }
};

// Thrown by a reader at the first row (in batch, head, row order) that is no range of keys.
struct NotStructure {
  std::string reason;
};
std::string not_one_range(std::int64_t b, std::int64_t i);
std::string adds_a_bias(std::int64_t b, std::int64_t i, double value);
std::string hides_every_key_by_finite_values(std::int64_t b, std::int64_t i);

// What a mask whose rows these are was found to be (heads with the same rows are one group).
MaskReading fitted_reading(MaskRows rows, const AttentionShape& shape);

}  // namespace attnreplay::mask_rows
