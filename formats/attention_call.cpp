#include "formats/attention_call.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>

#include "formats/errors.h"

namespace attnreplay {

std::string_view layout_name(Layout layout) {
  switch (layout) {
    case Layout::bhsd: return "bhsd";
    case Layout::bshd: return "bshd";
    case Layout::thd: return "thd";
  }
  return "?";
}

std::optional<Layout> parse_layout(std::string_view text) {
  if (text == "bhsd" || text == "BHSD") return Layout::bhsd;
  if (text == "bshd" || text == "BSHD") return Layout::bshd;
  if (text == "thd" || text == "THD") return Layout::thd;
  return std::nullopt;
}

const std::vector<std::string>& layout_names() {
  static const std::vector<std::string> names{"bhsd", "bshd", "thd"};
  return names;
}

std::string_view causal_alignment_name(CausalAlignment alignment) {
  return alignment == CausalAlignment::top_left ? "top_left" : "bottom_right";
}

std::optional<CausalAlignment> parse_causal_alignment(std::string_view text) {
  if (text == "top_left") return CausalAlignment::top_left;
  if (text == "bottom_right") return CausalAlignment::bottom_right;
  return std::nullopt;
}

const std::vector<std::string>& causal_alignment_names() {
  static const std::vector<std::string> names{"top_left", "bottom_right"};
  return names;
}

std::string AttentionShape::to_string() const {
  return fmt::format("b{} hq{} hkv{} sq{} skv{} dqk{} dvo{}", batch, heads_q, heads_kv, seq_q, seq_kv,
                     head_dim_qk, head_dim_vo);
}

std::string AttentionCall::where() const {
  return fmt::format("{}: call {}", source.empty() ? std::string("<memory>") : source, call_index);
}

double AttentionCall::softmax_scale() const {
  if (scale) return *scale;
  return 1.0 / std::sqrt(static_cast<double>(shape().head_dim_qk));
}

std::array<std::int64_t, 4> AttentionCall::bhsd_dims(const HostTensor& tensor,
                                                     std::string_view field) const {
  const std::string place = fmt::format("{}: field '{}'", where(), field);
  for (std::int64_t dim : tensor.shape) {
    if (dim <= 0) throw_input_error(place, "expected positive dims, got {}", shape_string(tensor.shape));
  }
  if (layout == Layout::thd) {
    // Packed rows (t, h, d), or the pages of a KV cache (pages, page_size, h, d), as one sequence.
    const bool pages = is_paged() && (field == "k" || field == "v");
    if (tensor.rank() != (pages ? 4 : 3)) {
      throw_input_error(place, "expected {} dims ({}), got {} ({})", pages ? 4 : 3,
                        pages ? "pages, page_size, heads, dim" : "tokens, heads, dim", tensor.rank(),
                        shape_string(tensor.shape));
    }
    if (pages) return {1, tensor.shape[2], tensor.shape[0] * tensor.shape[1], tensor.shape[3]};
    return {1, tensor.shape[1], tensor.shape[0], tensor.shape[2]};
  }
  if (tensor.rank() == 3 && layout == Layout::bhsd) {
    // SDPA accepts (N, L, E): one head per batch entry.
    return {tensor.shape[0], 1, tensor.shape[1], tensor.shape[2]};
  }
  if (tensor.rank() != 4) {
    throw_input_error(place, "expected 4 dims ({}), got {} ({})",
                      layout == Layout::bhsd ? "batch, heads, seq, dim" : "batch, seq, heads, dim",
                      tensor.rank(), shape_string(tensor.shape));
  }
  if (layout == Layout::bhsd) return {tensor.shape[0], tensor.shape[1], tensor.shape[2], tensor.shape[3]};
  return {tensor.shape[0], tensor.shape[2], tensor.shape[1], tensor.shape[3]};
}

std::vector<std::pair<std::string_view, const HostTensor*>> AttentionCall::named_tensors() const {
  std::vector<std::pair<std::string_view, const HostTensor*>> named = {{"q", &q}, {"k", &k}, {"v", &v}};
  if (mask) named.emplace_back("mask", &*mask);
  if (out) named.emplace_back("out", &*out);
  if (alibi_slopes) named.emplace_back("alibi_slopes", &*alibi_slopes);
  if (sinks) named.emplace_back("sinks", &*sinks);
  if (cu_seqlens_q) named.emplace_back("cu_seqlens_q", &*cu_seqlens_q);
  if (cu_seqlens_k) named.emplace_back("cu_seqlens_k", &*cu_seqlens_k);
  if (seqused_k) named.emplace_back("seqused_k", &*seqused_k);
  if (block_table) named.emplace_back("block_table", &*block_table);
  return named;
}

std::vector<std::pair<std::string_view, HostTensor*>> AttentionCall::named_tensors() {
  std::vector<std::pair<std::string_view, HostTensor*>> named;
  for (const auto& [name, tensor] : std::as_const(*this).named_tensors()) {
    named.emplace_back(name, const_cast<HostTensor*>(tensor));
  }
  return named;
}

HostTensor* AttentionCall::tensor_field(std::string_view name) {
  if (name == "q") return &q;
  if (name == "k") return &k;
  if (name == "v") return &v;
  if (name == "mask") return &mask.emplace();
  if (name == "out") return &out.emplace();
  if (name == "alibi_slopes") return &alibi_slopes.emplace();
  if (name == "sinks") return &sinks.emplace();
  if (name == "cu_seqlens_q") return &cu_seqlens_q.emplace();
  if (name == "cu_seqlens_k") return &cu_seqlens_k.emplace();
  if (name == "seqused_k") return &seqused_k.emplace();
  if (name == "block_table") return &block_table.emplace();
  return nullptr;
}

std::int64_t AttentionCall::diagonal_offset(const AttentionShape& s) const {
  return causal_alignment == CausalAlignment::bottom_right ? s.seq_kv - s.seq_q : 0;
}

std::pair<std::int64_t, std::int64_t> AttentionCall::visible_keys(std::int64_t i, const AttentionShape& s) const {
  const std::int64_t diagonal = i + diagonal_offset(s);
  std::int64_t first = 0, end = s.seq_kv;
  if (is_causal) end = std::min(end, diagonal + 1);
  if (window_right) end = std::min(end, diagonal + *window_right + 1);
  if (window_left) first = std::max(first, diagonal - *window_left);
  return {std::clamp<std::int64_t>(first, 0, s.seq_kv), std::clamp<std::int64_t>(end, 0, s.seq_kv)};
}

double AttentionCall::alibi_slope(std::int64_t b, std::int64_t h) const {
  if (!alibi_slopes) return 0.0;
  return alibi_slopes->rank() == 2 ? alibi_slopes->at(b * alibi_slopes->shape[1] + h) : alibi_slopes->at(h);
}

double AttentionCall::sink(std::int64_t h) const {
  return sinks ? sinks->at(h) : -std::numeric_limits<double>::infinity();
}

std::vector<AttentionCall::Extension> AttentionCall::extensions() const {
  std::vector<Extension> found;
  if (window_left || window_right) found.push_back(Extension::window);
  if (softcap > 0) found.push_back(Extension::softcap);
  if (alibi_slopes) found.push_back(Extension::alibi);
  if (sinks) found.push_back(Extension::sinks);
  return found;
}

std::string AttentionCall::describe(Extension extension) const {
  switch (extension) {
    case Extension::window: {
      std::vector<std::string> sides;
      if (window_left) sides.push_back(fmt::format("left {}", *window_left));
      if (window_right) sides.push_back(fmt::format("right {}", *window_right));
      return fmt::format("a sliding window ({})", fmt::join(sides, ", "));
    }
    case Extension::softcap: return fmt::format("a softcap of {}", softcap);
    case Extension::alibi: return "ALiBi slopes";
    case Extension::sinks: return "attention sinks";
  }
  return "?";
}

AttentionShape AttentionCall::shape() const {
  const auto q_dims = bhsd_dims(q, "q");
  const auto k_dims = bhsd_dims(k, "k");
  const auto v_dims = bhsd_dims(v, "v");
  AttentionShape s{q_dims[0], q_dims[1], k_dims[1], q_dims[2], k_dims[2], q_dims[3], v_dims[3]};
  auto fail = [this](std::string_view field, const std::string& what) {
    throw_input_error(fmt::format("{}: field '{}'", where(), field), "{}", what);
  };
  for (const auto* tensor : {&q, &k, &v}) {
    if (!dtype_is_floating(tensor->dtype)) {
      fail(tensor == &q ? "q" : tensor == &k ? "k" : "v",
           fmt::format("expected a floating dtype, got {}", dtype_name(tensor->dtype)));
    }
  }
  if (k_dims[0] != s.batch) fail("k", fmt::format("expected batch {} (from q), got {}", s.batch, k_dims[0]));
  if (v_dims[0] != s.batch) fail("v", fmt::format("expected batch {} (from q), got {}", s.batch, v_dims[0]));
  if (k_dims[3] != s.head_dim_qk)
    fail("k", fmt::format("expected head dim {} (from q), got {}", s.head_dim_qk, k_dims[3]));
  if (v_dims[1] != s.heads_kv) fail("v", fmt::format("expected {} heads (from k), got {}", s.heads_kv, v_dims[1]));
  if (v_dims[2] != s.seq_kv) fail("v", fmt::format("expected seq {} (from k), got {}", s.seq_kv, v_dims[2]));
  if (s.heads_q % s.heads_kv != 0)
    fail("k", fmt::format("expected a head count dividing q's {} (GQA), got {}", s.heads_q, s.heads_kv));
  if (out) {
    const auto o = bhsd_dims(*out, "out");
    const std::array<std::int64_t, 4> want{s.batch, s.heads_q, s.seq_q, s.head_dim_vo};
    if (o != want) {
      fail("out", fmt::format("expected (b, h, s, d) = ({}), got ({})", fmt::join(want, ", "),
                              fmt::join(o, ", ")));
    }
  }
  if (mask) {
    const std::array<std::int64_t, 4> full{s.batch, s.heads_q, s.seq_q, s.seq_kv};
    if (mask->rank() > 4 || mask->rank() < 1)
      fail("mask", fmt::format("expected 1 to 4 dims, got {}", mask->rank()));
    for (int i = 0; i < mask->rank(); ++i) {
      const std::int64_t dim = mask->shape[mask->rank() - 1 - i];
      const std::int64_t target = full[3 - i];
      if (dim != 1 && dim != target) {
        fail("mask", fmt::format("expected a shape broadcastable to ({}), got {}", fmt::join(full, ", "),
                                 shape_string(mask->shape)));
      }
    }
    if (mask->dtype != DType::boolean && !dtype_is_floating(mask->dtype))
      fail("mask", fmt::format("expected bool or floating, got {}", dtype_name(mask->dtype)));
  }
  if (!(dropout_p >= 0.0 && dropout_p < 1.0)) fail("dropout_p", fmt::format("expected [0, 1), got {}", dropout_p));
  if (window_left && *window_left < 0) fail("window_left", fmt::format("expected >= 0 or unset, got {}", *window_left));
  if (window_right && *window_right < 0) fail("window_right", fmt::format("expected >= 0 or unset, got {}", *window_right));
  if (!(softcap >= 0.0 && std::isfinite(softcap))) fail("softcap", fmt::format("expected >= 0, got {}", softcap));
  const std::int64_t batch = is_ragged() ? check_ragged_fields() : s.batch;
  if (alibi_slopes) {
    const bool per_head = alibi_slopes->shape == std::vector<std::int64_t>{s.heads_q};
    const bool per_sequence = alibi_slopes->shape == std::vector<std::int64_t>{batch, s.heads_q};
    if (!per_head && !per_sequence) {
      fail("alibi_slopes", fmt::format("expected ({}) or ({}, {}), got {}", s.heads_q, batch, s.heads_q,
                                       shape_string(alibi_slopes->shape)));
    }
    if (!dtype_is_floating(alibi_slopes->dtype))
      fail("alibi_slopes", fmt::format("expected a floating dtype, got {}", dtype_name(alibi_slopes->dtype)));
  }
  if (sinks) {
    if (sinks->shape != std::vector<std::int64_t>{s.heads_q})
      fail("sinks", fmt::format("expected ({}), got {}", s.heads_q, shape_string(sinks->shape)));
    if (!dtype_is_floating(sinks->dtype))
      fail("sinks", fmt::format("expected a floating dtype, got {}", dtype_name(sinks->dtype)));
  }
  if (scale && !std::isfinite(*scale)) fail("scale", fmt::format("expected a finite number, got {}", *scale));
  for (const auto& [name, tensor] : named_tensors()) {
    if (tensor->bytes && tensor->bytes->size() != tensor->nbytes()) {
      fail(name, fmt::format("expected {} bytes for {} {}, got {}", tensor->nbytes(), dtype_name(tensor->dtype),
                             shape_string(tensor->shape), tensor->bytes->size()));
    }
  }
  return s;
}

HostTensor to_bhsd(const HostTensor& tensor, Layout layout) {
  if (layout == Layout::thd) {
    // (t, h, d) is (1, t, h, d) in BSHD; pages (p, page_size, h, d) are (1, p * page_size, h, d).
    HostTensor as_bshd = tensor;
    if (tensor.rank() == 3) as_bshd.shape = {1, tensor.shape[0], tensor.shape[1], tensor.shape[2]};
    if (tensor.rank() == 4) as_bshd.shape = {1, tensor.shape[0] * tensor.shape[1], tensor.shape[2], tensor.shape[3]};
    as_bshd.captured_strides.clear();
    return to_bhsd(as_bshd, Layout::bshd);
  }
  if (layout == Layout::bhsd || tensor.rank() != 4) {
    HostTensor same = tensor;
    if (tensor.rank() == 3) same.shape = {tensor.shape[0], 1, tensor.shape[1], tensor.shape[2]};
    return same;
  }
  const std::int64_t b = tensor.shape[0], s = tensor.shape[1], h = tensor.shape[2], d = tensor.shape[3];
  HostTensor out = HostTensor::allocate(tensor.dtype, {b, h, s, d});
  out.device = tensor.device;
  const std::size_t row = static_cast<std::size_t>(d) * dtype_size(tensor.dtype);
  const std::byte* in = tensor.data();
  std::byte* dst = out.mutable_data();
  for (std::int64_t bi = 0; bi < b; ++bi)
    for (std::int64_t si = 0; si < s; ++si)
      for (std::int64_t hi = 0; hi < h; ++hi) {
        const std::size_t from = static_cast<std::size_t>(((bi * s + si) * h + hi)) * row;
        const std::size_t to = static_cast<std::size_t>(((bi * h + hi) * s + si)) * row;
        std::memcpy(dst + to, in + from, row);
      }
  return out;
}

}  // namespace attnreplay
