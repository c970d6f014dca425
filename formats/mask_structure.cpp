#include "formats/mask_structure.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>

#include "formats/attention_call.h"
#include "formats/content_hash.h"
#include "formats/errors.h"
#include "formats/mask_rows.h"
#include "formats/mask_view.h"

namespace attnreplay {

// ---- The structure ----

MaskStructure MaskStructure::all_visible(const AttentionShape& shape) {
  MaskStructure all;
  all.batch = shape.batch;
  all.seq_q = shape.seq_q;
  all.seq_kv = shape.seq_kv;
  all.key_begin.assign(static_cast<std::size_t>(shape.batch), 0);
  all.key_end.assign(static_cast<std::size_t>(shape.batch), shape.seq_kv);
  all.row_begin.assign(static_cast<std::size_t>(shape.batch), 0);
  all.row_end.assign(static_cast<std::size_t>(shape.batch), shape.seq_q);
  return all;
}

bool MaskStructure::every_row_sees_every_key() const {
  if (lower || (upper && *upper < seq_kv - 1)) return false;
  for (const auto& docs : documents) {
    if (!docs.empty()) return false;
  }
  auto all = [](const std::vector<std::int64_t>& values, std::int64_t value) {
    return std::all_of(values.begin(), values.end(), [value](std::int64_t v) { return v == value; });
  };
  return all(key_begin, 0) && all(key_end, seq_kv) && all(row_begin, 0) && all(row_end, seq_q);
}

std::pair<std::int64_t, std::int64_t> MaskStructure::row_keys(std::int64_t b, std::int64_t h, std::int64_t i) const {
  const std::size_t g = group(b, h);
  if (i < row_begin[g] || i >= row_end[g]) return {0, 0};
  std::int64_t first = key_begin[g], end = key_end[g];
  if (!documents.empty()) {
    const auto& docs = documents[g];
    // The first document that ends after row i; the row is in it when it starts at or before i.
    const auto doc = std::upper_bound(docs.begin(), docs.end(), i,
                                      [](std::int64_t row, const Document& d) { return row < d.q_end; });
    if (doc == docs.end() || doc->q_begin > i) return {0, 0};
    first = std::max(first, doc->k_begin);
    end = std::min(end, doc->k_end);
  }
  if (upper) end = std::min(end, i + *upper + 1);
  if (lower) first = std::max(first, i + *lower);
  first = std::clamp<std::int64_t>(first, 0, seq_kv);
  end = std::clamp<std::int64_t>(end, 0, seq_kv);
  return first < end ? std::pair{first, end} : std::pair<std::int64_t, std::int64_t>{0, 0};
}

MaskStructure MaskStructure::with_diagonals(std::optional<std::int64_t> upper_bound,
                                            std::optional<std::int64_t> lower_bound) const {
  MaskStructure both = *this;
  if (upper_bound) both.upper = upper ? std::min(*upper, *upper_bound) : *upper_bound;
  if (lower_bound) both.lower = lower ? std::max(*lower, *lower_bound) : *lower_bound;
  return both;
}

namespace {

// "0/37/120/300", or the first eight then how many in all.
std::string listed(const std::vector<std::string>& values) {
  constexpr std::size_t kShown = 8;
  if (values.size() <= kShown) return fmt::format("{}", fmt::join(values, "/"));
  return fmt::format("{}/... ({} in all)", fmt::join(values.begin(), values.begin() + kShown, "/"), values.size());
}

// "left padding, keys from 0/37/120/300" for per-group ranges [begin, end) of `extent`; nullopt when
// every group has all of it.
std::optional<std::string> padding_words(const std::vector<std::int64_t>& begin, const std::vector<std::int64_t>& end,
                                         std::int64_t extent, std::string_view what, std::string_view per_head) {
  bool begins_zero = true, ends_full = true;
  std::vector<std::string> begins, ends, ranges;
  for (std::size_t g = 0; g < begin.size(); ++g) {
    const bool none = begin[g] >= end[g];
    begins_zero = begins_zero && (none || begin[g] == 0);
    ends_full = ends_full && (none || end[g] == extent);
    begins.push_back(none ? "none" : std::to_string(begin[g]));
    ends.push_back(none ? "none" : std::to_string(end[g]));
    ranges.push_back(none ? "none" : fmt::format("[{}, {})", begin[g], end[g]));
  }
  if (!begins_zero && ends_full) return fmt::format("left padding{}, {} from {}", per_head, what, listed(begins));
  if (begins_zero && !ends_full) return fmt::format("right padding{}, {} up to {}", per_head, what, listed(ends));
  if (!begins_zero) return fmt::format("{}{} {}", what, per_head, listed(ranges));
  return std::nullopt;
}

}  // namespace

std::string MaskStructure::describe() const {
  std::vector<std::string> parts;
  if (upper) {
    if (*upper == seq_kv - seq_q) parts.push_back(seq_q == seq_kv ? "causal" : "causal (bottom-right)");
    else if (*upper == 0) parts.push_back("causal (top-left)");
    else parts.push_back(fmt::format("causal (keys up to row{:+})", *upper));
  }
  if (lower) {
    parts.push_back(upper ? fmt::format("a sliding window of {} keys", *upper - *lower + 1)
                          : fmt::format("keys from row{:+} on", *lower));
  }
  const std::string per_head = heads > 1 ? " per head" : "";
  if (!documents.empty()) {
    std::vector<std::string> counts;
    std::size_t most = 0;
    for (const auto& docs : documents) counts.push_back(std::to_string(docs.size())), most = std::max(most, docs.size());
    parts.push_back(counts.size() == 1 ? fmt::format("{} packed documents", most)
                                       : fmt::format("packed documents ({} per sequence{})", listed(counts), per_head));
  } else if (auto keys = padding_words(key_begin, key_end, seq_kv, "keys", per_head)) {
    parts.push_back(*keys);
  }
  if (auto rows = padding_words(row_begin, row_end, seq_q, "query rows", per_head)) parts.push_back(*rows);
  if (parts.empty()) return "no key hidden";
  return fmt::format("{}", fmt::join(parts, " + "));
}

// ---- Reading a mask ----

namespace {

using mask_rows::MaskRows;
using mask_rows::NotStructure;
using mask_rows::RowRange;
using mask_rows::adds_a_bias;
using mask_rows::hides_every_key_by_finite_values;
using mask_rows::not_one_range;

// Row i of group g (batch b, head h) as one range of keys, or why it is not one.
RowRange read_row(const MaskView& mask, const AttentionShape& s, std::int64_t b, std::int64_t h, std::int64_t i,
                  std::vector<double>& bias) {
  if (const std::byte* bytes = mask.contiguous_row(b, h, i); bytes && mask.dtype() == DType::boolean) {
    // A bool row by whole bytes, in the vectorized loops of <algorithm>: masks reach 10^8 elements.
    const auto* row = reinterpret_cast<const std::uint8_t*>(bytes);
    const auto* end = row + s.seq_kv;
    const auto* first = std::find_if(row, end, [](std::uint8_t x) { return x != 0; });
    if (first == end) return {};
    const auto* last = std::find_if(std::make_reverse_iterator(end), std::make_reverse_iterator(first),
                                    [](std::uint8_t x) { return x != 0; }).base();
    if (std::count(first, last, std::uint8_t{0}) != 0) {
      throw NotStructure{not_one_range(b, i)};
    }
    return {first - row, last - row};
  }
  mask.row(b, h, i, 0, s.seq_kv, bias.data());
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::int64_t lo = -1, hi = -1, seen = 0;
  bool finite_hider = false;
  for (std::int64_t j = 0; j < s.seq_kv; ++j) {
    const double value = bias[static_cast<std::size_t>(j)];
    if (value == 0) {
      if (lo < 0) lo = j;
      hi = j + 1;
      ++seen;
    } else if (value == -kInf) {
      continue;
    } else if (value <= kHidingAddend) {
      finite_hider = true;
    } else {
      throw NotStructure{adds_a_bias(b, i, value)};
    }
  }
  if (seen == 0) {
    if (finite_hider) {
      throw NotStructure{hides_every_key_by_finite_values(b, i)};
    }
    return {};
  }
  if (seen != hi - lo) throw NotStructure{not_one_range(b, i)};
  return {lo, hi};
}

MaskRows read_rows(const HostTensor& mask_tensor, const AttentionShape& s) {
  const MaskView mask(mask_tensor, s);
  MaskRows out;
  out.heads = mask.per_head() ? s.heads_q : 1;
  out.groups = s.batch * out.heads;
  out.seq_q = s.seq_q;
  out.rows.resize(static_cast<std::size_t>(out.groups * s.seq_q));
  // A mask without a row dim of its own (key padding, (b, 1, 1, s_kv)) is read once per group.
  const bool rows_alike = mask_tensor.rank() < 2 || (mask_tensor.shape[mask_tensor.rank() - 2] == 1 && s.seq_q > 1);
  std::vector<double> bias(static_cast<std::size_t>(s.seq_kv));
  for (std::int64_t g = 0; g < out.groups; ++g) {
    const std::int64_t b = g / out.heads, h = g % out.heads;
    for (std::int64_t i = 0; i < s.seq_q; ++i) {
      out.rows[static_cast<std::size_t>(g * s.seq_q + i)] =
          rows_alike && i > 0 ? out.at(g, 0) : read_row(mask, s, b, h, i, bias);
    }
  }
  return out;
}

// Whether the structure gives every row of group g the keys it has.
bool rebuilds_group(const MaskStructure& structure, const MaskRows& rows, std::int64_t g) {
  const std::int64_t b = g / rows.heads, h = g % rows.heads;
  for (std::int64_t i = 0; i < rows.seq_q; ++i) {
    const auto [first, end] = structure.row_keys(b, h, i);
    const RowRange& actual = rows.at(g, i);
    if (actual.empty() ? first < end : (first != actual.lo || end != actual.hi)) return false;
  }
  return true;
}

bool rebuilds(const MaskStructure& structure, const MaskRows& rows) {
  for (std::int64_t g = 0; g < rows.groups; ++g) {
    if (!rebuilds_group(structure, rows, g)) return false;
  }
  return true;
}

MaskStructure skeleton(const MaskRows& rows, const AttentionShape& s) {
  MaskStructure structure;
  structure.batch = s.batch;
  structure.heads = rows.heads;
  structure.seq_q = s.seq_q;
  structure.seq_kv = s.seq_kv;
  return structure;
}

// Per group, the keys its rows see as one span and the rows that see any; [0, 0) both without.
struct GroupSpan {
  RowRange keys, rows;
};
std::vector<GroupSpan> group_spans(const MaskRows& rows) {
  std::vector<GroupSpan> spans(static_cast<std::size_t>(rows.groups));
  for (std::int64_t g = 0; g < rows.groups; ++g) {
    GroupSpan& span = spans[static_cast<std::size_t>(g)];
    for (std::int64_t i = 0; i < rows.seq_q; ++i) {
      const RowRange& r = rows.at(g, i);
      if (r.empty()) continue;
      const bool first = span.rows.empty();
      span.keys = first ? r : RowRange{std::min(span.keys.lo, r.lo), std::max(span.keys.hi, r.hi)};
      span.rows = {first ? i : span.rows.lo, i + 1};
    }
  }
  return spans;
}

// A group's ranges widened to the whole call where the diagonals already give what they cut, so
// that a causal mask does not also read as padding.
void widen_where_implied(MaskStructure& structure, const MaskRows& rows) {
  for (std::int64_t g = 0; g < rows.groups; ++g) {
    const auto at = static_cast<std::size_t>(g);
    if (structure.key_begin[at] >= structure.key_end[at]) continue;
    for (auto [field, whole] : {std::pair{&structure.key_begin, std::int64_t{0}}, std::pair{&structure.key_end, structure.seq_kv},
                                std::pair{&structure.row_begin, std::int64_t{0}}, std::pair{&structure.row_end, structure.seq_q}}) {
      const std::int64_t kept = (*field)[at];
      (*field)[at] = whole;
      if (!rebuilds_group(structure, rows, g)) (*field)[at] = kept;
    }
  }
}

// One diagonal for every row it cuts, or none: `offset(row, range)` gives the row's candidate where
// it cuts it (nullopt where it does not); candidates that differ mean no such diagonal.
template <typename Offset>
std::optional<std::int64_t> common_diagonal(const MaskRows& rows, const std::vector<GroupSpan>& spans, Offset offset,
                                            bool& consistent) {
  std::optional<std::int64_t> found;
  for (std::int64_t g = 0; g < rows.groups; ++g) {
    for (std::int64_t i = 0; i < rows.seq_q; ++i) {
      const RowRange& r = rows.at(g, i);
      if (r.empty()) continue;
      const auto candidate = offset(i, r, spans[static_cast<std::size_t>(g)]);
      if (!candidate) continue;
      if (found && *found != *candidate) consistent = false;
      found = candidate;
    }
  }
  return found;
}

// Key ranges per group with diagonals: padding, causality, a sliding window.
std::optional<MaskStructure> fit_ranges(const MaskRows& rows, const AttentionShape& s) {
  const std::vector<GroupSpan> spans = group_spans(rows);
  bool consistent = true;
  MaskStructure structure = skeleton(rows, s);
  structure.upper = common_diagonal(rows, spans, [](std::int64_t i, const RowRange& r, const GroupSpan& span) {
    return r.hi < span.keys.hi ? std::optional<std::int64_t>(r.hi - 1 - i) : std::nullopt;
  }, consistent);
  structure.lower = common_diagonal(rows, spans, [](std::int64_t i, const RowRange& r, const GroupSpan& span) {
    return r.lo > span.keys.lo ? std::optional<std::int64_t>(r.lo - i) : std::nullopt;
  }, consistent);
  if (!consistent) return std::nullopt;
  for (const GroupSpan& span : spans) {
    structure.key_begin.push_back(span.keys.lo), structure.key_end.push_back(span.keys.hi);
    structure.row_begin.push_back(span.rows.lo), structure.row_end.push_back(span.rows.hi);
  }
  if (!rebuilds(structure, rows)) return std::nullopt;
  widen_where_implied(structure, rows);
  return structure;
}

// Packed documents (block-diagonal), with causality inside each where the rows say so.
std::optional<MaskStructure> fit_documents(const MaskRows& rows, const AttentionShape& s) {
  if (s.seq_q != s.seq_kv) return std::nullopt;
  MaskStructure structure = skeleton(rows, s);
  structure.documents.resize(static_cast<std::size_t>(rows.groups));
  bool several = false;
  for (std::int64_t g = 0; g < rows.groups; ++g) {
    auto& docs = structure.documents[static_cast<std::size_t>(g)];
    for (std::int64_t i = 0; i < rows.seq_q; ++i) {
      const RowRange& r = rows.at(g, i);
      if (r.empty()) continue;
      if (docs.empty() || docs.back().k_begin != r.lo || docs.back().q_end != i) {
        docs.push_back({i, i + 1, r.lo, r.hi});
      } else {
        docs.back().q_end = i + 1;
        docs.back().k_end = std::max(docs.back().k_end, r.hi);
      }
    }
    several = several || docs.size() > 1;
    structure.key_begin.push_back(docs.empty() ? 0 : docs.front().k_begin);
    structure.key_end.push_back(docs.empty() ? 0 : docs.back().k_end);
    structure.row_begin.push_back(docs.empty() ? 0 : docs.front().q_begin);
    structure.row_end.push_back(docs.empty() ? 0 : docs.back().q_end);
  }
  if (!several) return std::nullopt;
  // Documents of a packed sequence sit on the diagonal: rows [s, e) and keys [s, e), one after another.
  for (const auto& docs : structure.documents) {
    for (const auto& doc : docs) {
      if (doc.k_begin != doc.q_begin || doc.k_end != doc.q_end) return std::nullopt;
    }
  }
  bool consistent = true;
  for (std::int64_t g = 0; g < rows.groups; ++g) {
    for (const auto& doc : structure.documents[static_cast<std::size_t>(g)]) {
      for (std::int64_t i = doc.q_begin; i < doc.q_end; ++i) {
        const RowRange& r = rows.at(g, i);
        if (r.hi >= doc.k_end) continue;
        const std::int64_t candidate = r.hi - 1 - i;
        if (structure.upper && *structure.upper != candidate) consistent = false;
        structure.upper = candidate;
      }
    }
  }
  if (!consistent || !rebuilds(structure, rows)) return std::nullopt;
  widen_where_implied(structure, rows);
  return structure;
}

// A mask expanded to every head with the same rows in each (as some models pass it) is one group
// per sequence, as if broadcast.
MaskRows heads_alike_as_one(MaskRows rows, const AttentionShape& s) {
  if (rows.heads == 1) return rows;
  for (std::int64_t g = 0; g < rows.groups; ++g) {
    if (!std::equal(rows.rows.begin() + g * s.seq_q, rows.rows.begin() + (g + 1) * s.seq_q,
                    rows.rows.begin() + (g - g % rows.heads) * s.seq_q)) {
      return rows;
    }
  }
  MaskRows collapsed;
  collapsed.groups = s.batch;
  collapsed.seq_q = s.seq_q;
  for (std::int64_t b = 0; b < s.batch; ++b) {
    const auto first = rows.rows.begin() + b * rows.heads * s.seq_q;
    collapsed.rows.insert(collapsed.rows.end(), first, first + s.seq_q);
  }
  return collapsed;
}

}  // namespace

namespace mask_rows {

std::string not_one_range(std::int64_t b, std::int64_t i) {
  return fmt::format("query row {} of batch {} sees keys that are not one range", i, b);
}
std::string adds_a_bias(std::int64_t b, std::int64_t i, double value) {
  return fmt::format("query row {} of batch {} adds {} to a score (a bias, not only 0 and values that hide a key)", i, b,
                     value);
}
std::string hides_every_key_by_finite_values(std::int64_t b, std::int64_t i) {
  return fmt::format("query row {} of batch {} hides every key by finite values (softmax makes that a uniform average, "
                     "not a row without keys)", i, b);
}

MaskReading fitted_reading(MaskRows read, const AttentionShape& shape) {
  const MaskRows rows = heads_alike_as_one(std::move(read), shape);
  MaskReading reading;
  if ((reading.structure = fit_ranges(rows, shape))) return reading;
  if ((reading.structure = fit_documents(rows, shape))) return reading;
  reading.dense_reason = "its rows' key ranges follow no padding, diagonal or documents";
  return reading;
}

}  // namespace mask_rows

MaskReading read_mask_structure(const HostTensor& mask, const AttentionShape& shape) {
  try {
    return mask_rows::fitted_reading(read_rows(mask, shape), shape);
  } catch (const mask_rows::NotStructure& dense) {
    MaskReading reading;
    reading.dense_reason = dense.reason;
    return reading;
  }
}

// ---- A call's visibility ----

namespace {

// A model passes one mask to every layer of a step: the last few readings are kept, found again by
// the mask's content (compared whole, not trusted to its hash) and the call's shape.
MaskReading remembered_reading(const HostTensor& mask, const AttentionShape& shape) {
  struct Entry {
    HostTensor mask;
    std::uint64_t hash = 0;
    AttentionShape shape;
    MaskReading reading;
  };
  constexpr std::size_t kKept = 8;
  static std::mutex mutex;
  static std::deque<Entry> kept;
  const std::uint64_t hash = content_hash(mask.data(), mask.nbytes());
  auto same = [&](const Entry& entry) {
    return entry.hash == hash && entry.shape == shape && entry.mask.dtype == mask.dtype && entry.mask.shape == mask.shape &&
           (entry.mask.bytes == mask.bytes || std::memcmp(entry.mask.data(), mask.data(), mask.nbytes()) == 0);
  };
  {
    const std::lock_guard lock(mutex);
    if (const auto found = std::find_if(kept.begin(), kept.end(), same); found != kept.end()) return found->reading;
  }
  MaskReading reading = read_mask_structure(mask, shape);
  const std::lock_guard lock(mutex);
  kept.push_front({mask, hash, shape, reading});
  if (kept.size() > kKept) kept.pop_back();
  return reading;
}

}  // namespace

CallVisibility read_call_visibility(const AttentionCall& call) {
  ATTNREPLAY_ASSERT(!call.is_ragged(), "a ragged call's visibility is its sequences'");
  std::optional<MaskReading> mask;
  if (call.mask && call.mask->data()) mask = remembered_reading(*call.mask, call.shape());
  return call_visibility_with(call, mask);
}

CallVisibility call_visibility_with(const AttentionCall& call, const std::optional<MaskReading>& mask) {
  const AttentionShape s = call.shape();
  const std::int64_t diagonal = call.diagonal_offset(s);
  std::optional<std::int64_t> upper, lower;
  if (call.is_causal) upper = diagonal;
  if (call.window_right) upper = std::min(upper.value_or(diagonal + *call.window_right), diagonal + *call.window_right);
  if (call.window_left) lower = diagonal - *call.window_left;
  CallVisibility visibility;
  visibility.structure = MaskStructure::all_visible(s);
  if (call.mask && !mask) {
    visibility.dense_mask = true;  // a header without values (a call's shapes alone): nothing read
  } else if (call.mask) {
    if (mask->structure) {
      visibility.mask_found = mask->structure->describe();
      visibility.structure = *mask->structure;
    } else {
      visibility.mask_found = "dense: " + mask->dense_reason;
      visibility.dense_mask = true;
    }
  }
  visibility.structure = visibility.structure.with_diagonals(upper, lower);
  return visibility;
}

std::shared_ptr<const CallVisibility> visibility_of(const AttentionCall& call) {
  if (call.visibility) return call.visibility;
  return std::make_shared<const CallVisibility>(read_call_visibility(call));
}

// ---- One call per sequence ----

namespace {

// Rows [first, first + count) of batch entry b of a contiguous bhsd tensor, as (1, heads, count, dim).
HostTensor bhsd_rows(const HostTensor& bhsd, std::int64_t b, std::int64_t first, std::int64_t count, bool with_data) {
  const std::int64_t heads = bhsd.shape[1], seq = bhsd.shape[2], dim = bhsd.shape[3];
  HostTensor part;
  part.dtype = bhsd.dtype;
  part.device = bhsd.device;
  part.shape = {1, heads, count, dim};
  if (!with_data) return part;
  part = HostTensor::allocate(bhsd.dtype, {1, heads, count, dim});
  const std::size_t row_bytes = static_cast<std::size_t>(dim) * dtype_size(bhsd.dtype);
  for (std::int64_t h = 0; h < heads; ++h) {
    std::memcpy(part.mutable_data() + static_cast<std::size_t>(h * count) * row_bytes,
                bhsd.data() + static_cast<std::size_t>((b * heads + h) * seq + first) * row_bytes,
                static_cast<std::size_t>(count) * row_bytes);
  }
  return part;
}

}  // namespace

bool splits_by_key_ranges(const AttentionCall& call) {
  if (call.is_ragged() || !call.mask || call.alibi_slopes) return false;
  const std::shared_ptr<const CallVisibility> visibility = visibility_of(call);
  const MaskStructure& structure = visibility->structure;
  return !visibility->dense_mask && structure.heads == 1 && structure.documents.empty();
}

std::optional<std::vector<SequencePart>> split_by_key_ranges(const AttentionCall& call, bool with_data) {
  if (!splits_by_key_ranges(call)) return std::nullopt;
  const std::shared_ptr<const CallVisibility> visibility = visibility_of(call);
  const MaskStructure& structure = visibility->structure;
  const AttentionShape s = call.shape();
  // Without data, tensors of the parts' shapes alone.
  auto as_bhsd = [&](const HostTensor& tensor) {
    if (with_data) return to_bhsd(tensor, call.layout);
    const auto dims = call.bhsd_dims(tensor, "tensor");
    HostTensor shape_only;
    shape_only.dtype = tensor.dtype;
    shape_only.shape = {dims[0], dims[1], dims[2], dims[3]};
    return shape_only;
  };
  const HostTensor q = as_bhsd(call.q), k = as_bhsd(call.k), v = as_bhsd(call.v);
  const std::optional<HostTensor> out = call.out ? std::optional(as_bhsd(*call.out)) : std::nullopt;
  std::vector<SequencePart> parts;
  for (std::int64_t b = 0; b < s.batch; ++b) {
    const auto g = static_cast<std::size_t>(b);
    const std::int64_t r0 = structure.row_begin[g], r1 = structure.row_end[g];
    if (r1 <= r0) continue;  // no row sees a key: all 0
    const std::int64_t k0 = std::min(structure.key_begin[g], structure.key_end[g]), k1 = structure.key_end[g];
    SequencePart part{b, b, r0, r1 - r0, k0, k1 - k0, {}};
    AttentionCall& one = part.call;
    one.call_index = call.call_index;
    one.op = call.op;
    one.backend = call.backend;
    one.source = call.source;
    one.metadata = call.metadata;
    one.layout = Layout::bhsd;
    one.scale = call.softmax_scale();
    one.enable_gqa = call.enable_gqa;
    one.softcap = call.softcap;
    one.sinks = call.sinks;
    one.q = bhsd_rows(q, b, r0, r1 - r0, with_data);
    one.k = bhsd_rows(k, b, k0, k1 - k0, with_data);
    one.v = bhsd_rows(v, b, k0, k1 - k0, with_data);
    if (out) one.out = bhsd_rows(*out, b, r0, r1 - r0, with_data);
    // Row i' of the part is row r0 + i' of the call and key j' its key k0 + j': j <= i + d becomes
    // j' <= i' + d + r0 - k0.
    const AttentionShape part_shape{1, s.heads_q, s.heads_kv, r1 - r0, k1 - k0, s.head_dim_qk, s.head_dim_vo};
    auto moved = [&](std::optional<std::int64_t> diagonal) {
      return diagonal ? std::optional<std::int64_t>(*diagonal + r0 - k0) : std::nullopt;
    };
    CallVisibility part_visibility;
    part_visibility.structure = MaskStructure::all_visible(part_shape).with_diagonals(moved(structure.upper), moved(structure.lower));
    one.visibility = std::make_shared<const CallVisibility>(std::move(part_visibility));
    parts.push_back(std::move(part));
  }
  return parts;
}

}  // namespace attnreplay
