#pragma once
// The host copies a call's record is made of, started on the job's thread (HostCopy: no wait for
// its GPU) and finished into the record on capture's writer thread.
#include <cstdint>
#include <optional>

#include "capture/host_copy.h"
#include "capture/ragged_map.h"
#include "formats/attention_call.h"

namespace attnreplay::capture {

struct TensorCopies {
  std::optional<HostCopy> q, k, v, mask, out, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table;
  // A ragged call's copies are as ragged_map.h plans them (seqused_k and block_table holding the
  // call's own), made into the record's fields when finished.
  std::optional<RaggedLayout> ragged;
  std::optional<HostCopy> page_starts, last_page_lengths;
  // A dense (b, s, h, d) query of a paged or length-limited call is stored as its (b * s, h, d)
  // rows, and so is the output.
  bool flatten_batch = false;
  std::uint64_t finished_bytes = 0;  // copies finished early (a substituted call's inputs)

  std::uint64_t nbytes() const;
  // Finishes the copies still pending into `call`; a second call finishes only those started since.
  void finish_into(AttentionCall& call);

 private:
  // The record's thd fields from the ragged call's copies, here, off the job's thread.
  void finish_ragged_into(AttentionCall& call);
};

}  // namespace attnreplay::capture
