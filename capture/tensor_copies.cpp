#include "capture/tensor_copies.h"

namespace attnreplay::capture {

std::uint64_t TensorCopies::nbytes() const {
  std::uint64_t total = finished_bytes;
  for (const auto* copy : {&q, &k, &v, &mask, &out, &alibi_slopes, &sinks, &cu_seqlens_q, &cu_seqlens_k, &seqused_k,
                           &block_table, &page_starts, &last_page_lengths}) {
    total += *copy ? (*copy)->nbytes() : 0;
  }
  return total;
}

void TensorCopies::finish_into(AttentionCall& call) {
  auto finish = [this](std::optional<HostCopy>& copy, auto& field) {
    if (!copy) return;
    finished_bytes += copy->nbytes();
    field = copy->finish();
    copy.reset();
  };
  if (ragged) finish_ragged_into(call);
  finish(q, call.q);
  finish(k, call.k);
  finish(v, call.v);
  finish(mask, call.mask);
  finish(out, call.out);
  finish(alibi_slopes, call.alibi_slopes);
  finish(sinks, call.sinks);
  finish(cu_seqlens_q, call.cu_seqlens_q);
  finish(cu_seqlens_k, call.cu_seqlens_k);
  finish(seqused_k, call.seqused_k);
  finish(block_table, call.block_table);
  if (flatten_batch) {
    for (HostTensor* rows : {&call.q, call.out ? &*call.out : nullptr}) {
      if (!rows || rows->rank() != 4) continue;
      rows->shape = {rows->shape[0] * rows->shape[1], rows->shape[2], rows->shape[3]};
      rows->captured_strides.clear();
    }
  }
}

void TensorCopies::finish_ragged_into(AttentionCall& call) {
  RaggedHostCopies host;
  auto take = [this](std::optional<HostCopy>& copy) {
    std::optional<HostTensor> finished;
    if (copy) finished_bytes += copy->nbytes(), finished = copy->finish(), copy.reset();
    return finished;
  };
  host.q = *take(q), host.k = *take(k), host.v = *take(v);
  host.cu_seqlens_q = take(cu_seqlens_q), host.cu_seqlens_k = take(cu_seqlens_k), host.used = take(seqused_k);
  host.table = take(block_table), host.page_starts = take(page_starts);
  host.last_page_lengths = take(last_page_lengths);
  RaggedFields fields = ragged_fields(*ragged, std::move(host));
  ragged.reset();
  call.q = std::move(fields.q), call.k = std::move(fields.k), call.v = std::move(fields.v);
  call.cu_seqlens_q = std::move(fields.cu_seqlens_q), call.cu_seqlens_k = std::move(fields.cu_seqlens_k);
  call.seqused_k = std::move(fields.seqused_k), call.block_table = std::move(fields.block_table);
}

}  // namespace attnreplay::capture
