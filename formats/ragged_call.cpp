// Ragged and paged batches in the one call record (formats/attention_call.h): their checks, their
// sequences, and each sequence as a dense call for the kernels that take one at a time.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "formats/attention_call.h"
#include "formats/errors.h"

namespace attnreplay {
namespace {

bool is_index_dtype(DType dtype) { return dtype == DType::int32 || dtype == DType::int64; }

// The first of the call's tensors beside q, k, v and out (offsets, counts, the block table, ...)
// whose values were not read (a header), or empty when all were.
std::string_view unread_field(const AttentionCall& call) {
  for (const auto& [field, tensor] : call.named_tensors()) {
    if (field != "q" && field != "k" && field != "v" && field != "out" && !tensor->data()) return field;
  }
  return {};
}

// Row b of a block table: the pages sequence b lists.
std::vector<std::int64_t> table_row(const HostTensor& table, std::size_t b) {
  const std::int64_t width = table.shape[1];
  std::vector<std::int64_t> row(static_cast<std::size_t>(width));
  for (std::int64_t j = 0; j < width; ++j) row[static_cast<std::size_t>(j)] = static_cast<std::int64_t>(table.at(static_cast<std::int64_t>(b) * width + j));
  return row;
}

// Rows [first, first + count) of packed (t, h, d) as a (1, count, h, d) BSHD tensor.
HostTensor packed_rows(const HostTensor& packed, std::int64_t first, std::int64_t count) {
  HostTensor rows = HostTensor::allocate(packed.dtype, {1, count, packed.shape[1], packed.shape[2]});
  rows.device = packed.device;
  const std::size_t row_bytes = static_cast<std::size_t>(packed.shape[1] * packed.shape[2]) * dtype_size(packed.dtype);
  if (count > 0) std::memcpy(rows.mutable_data(), packed.data() + static_cast<std::size_t>(first) * row_bytes,
                             static_cast<std::size_t>(count) * row_bytes);
  return rows;
}

// The first `count` tokens of the pages `table` lists, from pages (p, page_size, h, d), as a
// (1, count, h, d) BSHD tensor.
HostTensor paged_rows(const HostTensor& pages, const std::int64_t* table, std::int64_t count) {
  const std::int64_t page_size = pages.shape[1];
  HostTensor rows = HostTensor::allocate(pages.dtype, {1, count, pages.shape[2], pages.shape[3]});
  rows.device = pages.device;
  const std::size_t row_bytes = static_cast<std::size_t>(pages.shape[2] * pages.shape[3]) * dtype_size(pages.dtype);
  std::byte* out = count > 0 ? rows.mutable_data() : nullptr;
  for (std::int64_t first = 0; first < count; first += page_size) {
    const std::int64_t n = std::min(page_size, count - first);
    std::memcpy(out + static_cast<std::size_t>(first) * row_bytes,
                pages.data() + static_cast<std::size_t>(table[first / page_size] * page_size) * row_bytes,
                static_cast<std::size_t>(n) * row_bytes);
  }
  return rows;
}

}  // namespace

std::int64_t AttentionCall::check_ragged_fields() const {
  auto fail = [this](std::string_view field, const std::string& what) {
    throw_input_error(fmt::format("{}: field '{}'", where(), field), "{}", what);
  };
  if (!cu_seqlens_q) fail("cu_seqlens_q", "a ragged (thd) call needs its sequences' query offsets");
  auto check_index = [&](const HostTensor& tensor, std::string_view field, std::vector<std::int64_t> want) {
    if (!is_index_dtype(tensor.dtype)) fail(field, fmt::format("expected int32 or int64, got {}", dtype_name(tensor.dtype)));
    const bool rank_ok = tensor.rank() == static_cast<int>(want.size());
    bool dims_ok = rank_ok;
    for (std::size_t i = 0; rank_ok && i < want.size(); ++i) dims_ok = dims_ok && (want[i] < 0 || tensor.shape[i] == want[i]);
    if (!dims_ok) {
      std::vector<std::string> dims;
      for (std::int64_t dim : want) dims.push_back(dim < 0 ? "n" : std::to_string(dim));
      fail(field, fmt::format("expected ({}), got {}", fmt::join(dims, ", "), shape_string(tensor.shape)));
    }
  };
  check_index(*cu_seqlens_q, "cu_seqlens_q", {-1});
  const std::int64_t n = cu_seqlens_q->shape[0] - 1;
  if (n < 1) fail("cu_seqlens_q", "expected at least 2 offsets (one sequence)");
  if (cu_seqlens_k) check_index(*cu_seqlens_k, "cu_seqlens_k", {n + 1});
  if (seqused_k) check_index(*seqused_k, "seqused_k", {n});
  if (block_table) {
    check_index(*block_table, "block_table", {n, -1});
    if (cu_seqlens_k) fail("cu_seqlens_k", "a paged call gives its key counts in seqused_k, not as offsets");
    if (!seqused_k) fail("seqused_k", "a paged call needs each sequence's key count");
  } else if (!cu_seqlens_k) {
    fail("cu_seqlens_k", "a ragged call with packed keys needs their offsets");
  }
  if (mask) fail("mask", "a ragged call takes no mask (its sequences' lengths say which keys exist)");
  return n;
}

std::vector<AttentionCall::Sequence> AttentionCall::sequences() const {
  const AttentionShape s = shape();
  auto fail = [this](std::string_view field, const std::string& what) {
    throw_input_error(fmt::format("{}: field '{}'", where(), field), "{}", what);
  };
  if (const std::string_view field = unread_field(*this); !field.empty()) fail(field, "its values were not read");
  auto offsets = [&](const HostTensor& tensor, std::string_view field, std::int64_t rows, std::string_view holder) {
    std::vector<std::int64_t> cu = tensor.to_integers();
    if (cu.front() != 0) fail(field, fmt::format("expected to start at 0, got {}", cu.front()));
    for (std::size_t b = 0; b + 1 < cu.size(); ++b) {
      if (cu[b + 1] < cu[b]) fail(field, fmt::format("decreases at sequence {} ({} then {})", b, cu[b], cu[b + 1]));
    }
    if (cu.back() != rows) fail(field, fmt::format("ends at {}, but {} has {} rows", cu.back(), holder, rows));
    return cu;
  };
  const std::vector<std::int64_t> cu_q = offsets(*cu_seqlens_q, "cu_seqlens_q", s.seq_q, "q");
  std::vector<Sequence> result(cu_q.size() - 1);
  for (std::size_t b = 0; b < result.size(); ++b) result[b].q_begin = cu_q[b], result[b].q_len = cu_q[b + 1] - cu_q[b];
  std::vector<std::int64_t> capacity(result.size());
  if (!is_paged()) {
    const std::vector<std::int64_t> cu_k = offsets(*cu_seqlens_k, "cu_seqlens_k", s.seq_kv, "k");
    for (std::size_t b = 0; b < result.size(); ++b) {
      result[b].k_begin = cu_k[b];
      result[b].k_len = capacity[b] = cu_k[b + 1] - cu_k[b];
    }
  } else {
    std::fill(capacity.begin(), capacity.end(), block_table->shape[1] * k.shape[1]);
  }
  if (seqused_k) {
    const std::vector<std::int64_t> used = seqused_k->to_integers();
    for (std::size_t b = 0; b < result.size(); ++b) {
      if (used[b] < 0 || used[b] > capacity[b]) {
        fail("seqused_k", fmt::format("sequence {} uses {} keys, but has {}", b, used[b], capacity[b]));
      }
      result[b].k_len = used[b];
    }
  }
  if (is_paged()) {
    const std::vector<std::int64_t> table = block_table->to_integers();
    const std::int64_t width = block_table->shape[1], page_size = k.shape[1], pages = k.shape[0];
    for (std::size_t b = 0; b < result.size(); ++b) {
      for (std::int64_t j = 0; j * page_size < result[b].k_len; ++j) {
        const std::int64_t page = table[b * static_cast<std::size_t>(width) + static_cast<std::size_t>(j)];
        if (page < 0 || page >= pages) {
          fail("block_table", fmt::format("sequence {}'s page {} is {}, but k holds pages 0..{}", b, j, page, pages - 1));
        }
      }
    }
  }
  return result;
}

AttentionCall AttentionCall::sequence_call(std::size_t b, const std::vector<Sequence>& sequences,
                                           bool with_data) const {
  const Sequence& sequence = sequences.at(b);
  AttentionCall one = *this;
  one.visibility.reset();  // a sequence of its own: its keys are read anew
  one.layout = Layout::bshd;
  one.cu_seqlens_q.reset();
  one.cu_seqlens_k.reset();
  one.seqused_k.reset();
  one.block_table.reset();
  if (!with_data) {
    auto rows = [](const HostTensor& like, std::int64_t count) {
      HostTensor shape_only = like;
      shape_only.bytes.reset();
      shape_only.captured_strides.clear();
      shape_only.shape = {1, count, like.shape[like.rank() - 2], like.shape[like.rank() - 1]};
      return shape_only;
    };
    one.q = rows(q, sequence.q_len);
    one.k = rows(k, sequence.k_len);
    one.v = rows(v, sequence.k_len);
    if (out) one.out = rows(*out, sequence.q_len);
    if (alibi_slopes && alibi_slopes->rank() == 2) {
      one.alibi_slopes->shape = {alibi_slopes->shape[1]};
      one.alibi_slopes->bytes.reset();
    }
    return one;
  }
  one.q = packed_rows(q, sequence.q_begin, sequence.q_len);
  if (out) one.out = packed_rows(*out, sequence.q_begin, sequence.q_len);
  if (is_paged()) {
    const std::vector<std::int64_t> row = table_row(*block_table, b);
    one.k = paged_rows(k, row.data(), sequence.k_len);
    one.v = paged_rows(v, row.data(), sequence.k_len);
  } else {
    one.k = packed_rows(k, sequence.k_begin, sequence.k_len);
    one.v = packed_rows(v, sequence.k_begin, sequence.k_len);
  }
  if (alibi_slopes && alibi_slopes->rank() == 2) {
    const std::int64_t heads = alibi_slopes->shape[1];
    HostTensor slopes = HostTensor::allocate(alibi_slopes->dtype, {heads});
    const std::size_t bytes = static_cast<std::size_t>(heads) * dtype_size(alibi_slopes->dtype);
    std::memcpy(slopes.mutable_data(), alibi_slopes->data() + b * bytes, bytes);
    one.alibi_slopes = std::move(slopes);
  }
  return one;
}

std::string AttentionCall::describe_batch() const {
  if (!is_ragged()) return {};
  const std::int64_t count = cu_seqlens_q ? cu_seqlens_q->numel() - 1 : 0;
  std::string text = fmt::format("a ragged batch of {} sequence{}", count, count == 1 ? "" : "s");
  if (unread_field(*this).empty()) {
    const std::vector<Sequence> all = sequences();
    auto [q_min, q_max] = std::minmax_element(all.begin(), all.end(), [](auto& a, auto& b) { return a.q_len < b.q_len; });
    auto [k_min, k_max] = std::minmax_element(all.begin(), all.end(), [](auto& a, auto& b) { return a.k_len < b.k_len; });
    text += fmt::format(" (queries {}..{}, keys {}..{})", q_min->q_len, q_max->q_len, k_min->k_len, k_max->k_len);
  }
  if (is_paged()) text += fmt::format(", paged (page size {}, {} pages)", k.shape.at(1), k.shape.at(0));
  return text;
}

}  // namespace attnreplay
