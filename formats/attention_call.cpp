#include "formats/attention_call.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "formats/errors.h"

namespace attnreplay {

std::string_view layout_name(Layout layout) { return layout == Layout::bhsd ? "bhsd" : "bshd"; }

std::optional<Layout> parse_layout(std::string_view text) {
  if (text == "bhsd" || text == "BHSD") return Layout::bhsd;
  if (text == "bshd" || text == "BSHD") return Layout::bshd;
  return std::nullopt;
}

std::string_view causal_alignment_name(CausalAlignment alignment) {
  return alignment == CausalAlignment::top_left ? "top_left" : "bottom_right";
}

std::optional<CausalAlignment> parse_causal_alignment(std::string_view text) {
  if (text == "top_left") return CausalAlignment::top_left;
  if (text == "bottom_right") return CausalAlignment::bottom_right;
  return std::nullopt;
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
  if (tensor.rank() == 3 && layout == Layout::bhsd) {
    // SDPA accepts (N, L, E): one head per batch entry.
    return {tensor.shape[0], 1, tensor.shape[1], tensor.shape[2]};
  }
  if (tensor.rank() != 4) {
    throw_input_error(place, "expected 4 dims ({}), got {} ({})",
                      layout == Layout::bhsd ? "batch, heads, seq, dim" : "batch, seq, heads, dim",
                      tensor.rank(), shape_string(tensor.shape));
  }
  for (std::int64_t dim : tensor.shape) {
    if (dim <= 0) throw_input_error(place, "expected positive dims, got {}", shape_string(tensor.shape));
  }
  if (layout == Layout::bhsd) return {tensor.shape[0], tensor.shape[1], tensor.shape[2], tensor.shape[3]};
  return {tensor.shape[0], tensor.shape[2], tensor.shape[1], tensor.shape[3]};
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
  if (scale && !std::isfinite(*scale)) fail("scale", fmt::format("expected a finite number, got {}", *scale));
  for (const auto* tensor : {&q, &k, &v}) {
    if (tensor->bytes && tensor->bytes->size() != tensor->nbytes()) {
      fail(tensor == &q ? "q" : tensor == &k ? "k" : "v",
           fmt::format("expected {} bytes for {} {}, got {}", tensor->nbytes(),
                       dtype_name(tensor->dtype), shape_string(tensor->shape), tensor->bytes->size()));
    }
  }
  return s;
}

HostTensor to_bhsd(const HostTensor& tensor, Layout layout) {
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
