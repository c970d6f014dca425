#pragma once
// The one record of an attention call. Capture fills it, the formats store it, kernels run it
// and replay reports on it.
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "formats/host_tensor.h"

namespace attnreplay {

// How the dims of Q, K, V and the output are ordered. SDPA takes BHSD; flash-attn's ops take BSHD.
enum class Layout { bhsd, bshd };
// Where the causal diagonal sits when s_q != s_kv: torch SDPA's is_causal is top-left,
// flash-attn (>= 2.1) is bottom-right. Equal lengths make them the same.
enum class CausalAlignment { top_left, bottom_right };

std::string_view layout_name(Layout layout);
std::optional<Layout> parse_layout(std::string_view text);
std::string_view causal_alignment_name(CausalAlignment alignment);
std::optional<CausalAlignment> parse_causal_alignment(std::string_view text);

struct AttentionShape {
  std::int64_t batch = 0;
  std::int64_t heads_q = 0;
  std::int64_t heads_kv = 0;
  std::int64_t seq_q = 0;
  std::int64_t seq_kv = 0;
  std::int64_t head_dim_qk = 0;
  std::int64_t head_dim_vo = 0;

  bool is_gqa() const { return heads_q != heads_kv; }
  std::string to_string() const;  // "b2 hq24 hkv24 sq4250 skv4250 dqk64 dvo64"
  bool operator==(const AttentionShape&) const = default;
};

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
  std::map<std::string, std::string> metadata;  // model, step, layer, thread, call site, ...
  // Where the call was read from; used in messages and rerun commands, not stored.
  std::string source;

  // "run.h5: call 17"
  std::string where() const;
  double softmax_scale() const;
  // Throws InputError naming the call and field when Q, K, V, mask or out disagree.
  AttentionShape shape() const;
  // The dims of a tensor named `field` in this call's layout as (batch, heads, seq, dim).
  std::array<std::int64_t, 4> bhsd_dims(const HostTensor& tensor, std::string_view field) const;
};

// Returns `tensor` (one of q, k, v, out in `layout`) as a contiguous (b, h, s, d) tensor.
HostTensor to_bhsd(const HostTensor& tensor, Layout layout);

}  // namespace attnreplay
