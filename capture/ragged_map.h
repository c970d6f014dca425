#pragma once
// Ragged and paged batches (flash-attn's varlen ops, FlashAttention-3's forward, vLLM's and SGLang's
// builds, FlashInfer's paged form) in the record's thd form (docs/format.md), in two parts, so that
// the job's thread never waits for its GPU:
// - plan_ragged_copies(), on the job's thread, picks what to copy from the arguments' shapes alone,
//   never their values: the tensors as given, and for a paged KV cache every page its table can
//   list (gathered on the job's stream, the table's slots clamped into the cache), or a dense cache
//   whole: the bounds the arguments give where the pages or keys read would take a read of values;
// - ragged_fields(), on capture's own thread, makes the record's fields from the host copies: a
//   paged cache cut down to the pages the call reads (renumbered in its block table), a dense cache
//   to the keys each sequence uses, the query's offsets and each sequence's key count.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>

#include "formats/host_tensor.h"

namespace attnreplay::capture {

// A ragged or paged call's arguments, as its op names them: null where absent.
struct RaggedArguments {
  const at::Tensor* q = nullptr;
  const at::Tensor* k = nullptr;
  const at::Tensor* v = nullptr;
  const at::Tensor* cu_seqlens_q = nullptr;
  const at::Tensor* cu_seqlens_k = nullptr;
  const at::Tensor* used = nullptr;   // seqused_k, seqlens_k or cache_seqlens: each sequence's keys
  const at::Tensor* table = nullptr;  // block_table or page_table
  // FlashInfer's paged form: sequence b reads pages page_indices[page_starts[b] .. page_starts[b+1]],
  // of which the last holds last_page_lengths[b] keys.
  const at::Tensor* page_starts = nullptr;
  const at::Tensor* page_indices = nullptr;
  const at::Tensor* last_page_lengths = nullptr;
};

// How a call's keys come, and what ragged_fields() needs to know of them: no tensor.
struct RaggedLayout {
  enum class Keys {
    packed,      // (total_k, h, d) by cu_seqlens_k
    paged,       // pages by a block table: K and V are the pages its every slot lists
    page_list,   // FlashInfer's: K and V are the pages page_indices lists, in its order
    dense_cache  // (b, s_cache, h, d) of which sequence b uses its first used[b] keys
  };
  Keys keys = Keys::packed;
  bool dense_query = false;          // Q came as (b, s, h, d): its rows packed, offsets from its shape
  std::int64_t batch = 0, query_len = 0;  // a dense query's
  std::int64_t page_size = 0, cache_pages = 0;  // a paged cache's
  std::string index_device;          // where the record's index tensors were made: the query's device
};

// What the job's thread copies (undefined where the call has none), and how.
struct RaggedCopies {
  RaggedLayout layout;
  at::Tensor q, k, v, cu_seqlens_q, cu_seqlens_k, used, table, page_starts, last_page_lengths;
  bool kv_gathered = false;  // k and v are pages gathered here, held by nothing else
};

// Nullopt for a dense call, or one in a form not recognised (its arguments are then kept, and
// refused). Reads no tensor's values.
std::optional<RaggedCopies> plan_ragged_copies(const RaggedArguments& arguments);

// The host copies of a RaggedCopies' tensors, under the same names.
struct RaggedHostCopies {
  HostTensor q, k, v;
  std::optional<HostTensor> cu_seqlens_q, cu_seqlens_k, used, table, page_starts, last_page_lengths;
};

// The record's fields of a ragged call.
struct RaggedFields {
  HostTensor q, k, v, cu_seqlens_q;
  std::optional<HostTensor> cu_seqlens_k, seqused_k, block_table;
};

// From the host copies, on capture's own thread: a pure function of its inputs. Throws
// std::runtime_error on copies that contradict each other (a table past its cache).
RaggedFields ragged_fields(const RaggedLayout& layout, RaggedHostCopies host);

}  // namespace attnreplay::capture
