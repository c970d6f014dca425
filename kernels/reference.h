#pragma once
// Exact softmax attention: every product and sum in fp64 from the stored inputs, streaming over
// keys (no s_q x s_kv matrix), so it stays valid at 100K+ tokens. Optionally only some query rows.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "formats/attention_call.h"
#include "kernels/kernel.h"

namespace attnreplay {

struct ReferenceOutput {
  AttentionShape shape;
  // Query positions computed, ascending; all of 0..seq_q-1 unless sampled.
  std::vector<std::int64_t> rows;
  bool sampled = false;
  // (batch, heads_q, rows.size(), head_dim_vo), row-major. Empty while the values are only on the
  // GPU (`device_values`): host_values() brings them over.
  std::vector<double> values;
  // The same on the GPU when it computed them: outputs are then compared there
  // (replay/judge/error_stats.h), without moving the reference to the host.
  std::optional<at::Tensor> device_values;
  // Rows whose every key is masked out. Their output is 0, as torch's math backend gives.
  std::int64_t fully_masked_rows = 0;
  // Per (batch, head, row slot), 1 where the row sees no key; empty when every row sees one. Such
  // rows (a left-padded prompt's pads) have no defined attention, and backends disagree on them:
  // errors are also reported over the other rows (replay/judge/error_stats.h).
  std::vector<std::uint8_t> no_key;
  // The same marks on the GPU, where `device_values` are: every kernel's comparison reads them there.
  std::optional<at::Tensor> device_no_key;

  double at(std::int64_t b, std::int64_t h, std::size_t row_slot, std::int64_t d) const {
    const auto n = static_cast<std::int64_t>(rows.size());
    return values[static_cast<std::size_t>(((b * shape.heads_q + h) * n + static_cast<std::int64_t>(row_slot)) *
                                               shape.head_dim_vo + d)];
  }
};

// The result's frame for `rows` of a call of shape `s` (all rows when `rows` is empty), without
// values: what both references fill in.
ReferenceOutput reference_output_for(const AttentionShape& s, std::vector<std::int64_t> rows);

// Fills `values` from `device_values` when only the GPU has them (for host-side readers: audit's
// per-head errors, CPU kernels' observers).
void host_values(ReferenceOutput& reference);

// Marks `reference`'s rows that see no key (every key masked by the mask or by causality), from
// the call alone: the same on whichever device the reference ran. A ragged call's reference has
// them marked already, sequence by sequence. Where the values are on the GPU the marks go there too.
void mark_rows_without_keys(const AttentionCall& call, ReferenceOutput& reference);

// A ragged call's reference (AttentionCall::is_ragged), one dense sequence at a time by `compute`,
// laid out as the call's packed view (batch 1, every sequence's rows in turn); a sequence with no
// keys gives rows of 0, marked as seeing none. Both references below go through it.
using SequenceReference = std::function<ReferenceOutput(const AttentionCall& sequence, std::vector<std::int64_t> rows)>;
ReferenceOutput reference_per_sequence(const AttentionCall& call, std::vector<std::int64_t> rows,
                                       const SequenceReference& compute);

// `rows` empty: every query row. Dropout is not applied (replay is inference).
ReferenceOutput reference_attention(const AttentionCall& call, std::vector<std::int64_t> rows = {},
                                    unsigned threads = 0);

// The same on a GPU (fp64 DGEMMs in chunks of query rows), for calls too large for the CPU.
bool gpu_reference_available();
// With `keep_on_device`, the values stay on the GPU (`device_values`) and `values` is left empty.
ReferenceOutput reference_attention_gpu(const AttentionCall& call, std::vector<std::int64_t> rows = {},
                                        bool keep_on_device = false);

// A reference run as a kernel, so that it is timed and checked like any other (the CPU one against
// itself, the GPU one against the CPU one).
class ReferenceKernel final : public Kernel {
 public:
  using Compute = ReferenceOutput (*)(const AttentionCall& call);
  using Available = bool (*)();
  ReferenceKernel(KernelDescription description, Compute compute, Available available)
      : description_(std::move(description)), compute_(compute), available_(available) {}
  const KernelDescription& description() const override { return description_; }
  std::optional<std::string> unsupported_reason(const AttentionCall&) const override;
  std::unique_ptr<PreparedKernel> prepare(const AttentionCall& call, const KernelOptions& options) const override;

 private:
  KernelDescription description_;
  Compute compute_;
  Available available_;
};

// `count` distinct query positions drawn uniformly with a fixed seed, ascending.
std::vector<std::int64_t> sample_query_rows(std::int64_t seq_q, std::int64_t count, std::uint64_t seed);

}  // namespace attnreplay
