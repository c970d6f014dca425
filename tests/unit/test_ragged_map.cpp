// Capture's ragged and paged mapping (capture/ragged_map.h): the job's thread plans its copies from
// shapes alone (meta tensors, which have no values, stand in for a GPU's: a read of a value throws),
// and the record's fields are made from the host copies, as the stand-ins' golden records hold them
// (tests/e2e/test_ragged_capture_records.py checks whole captures).
// ATen first: its logging's CHECK is then Catch2's.
#include <ATen/ATen.h>

#include "capture/ragged_map.h"
#include "formats/torch_tensor.h"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

using namespace attnreplay;
using namespace attnreplay::capture;

namespace {

at::Tensor meta(std::vector<std::int64_t> shape, at::ScalarType type = at::kHalf) {
  return at::empty(shape, at::TensorOptions().dtype(type).device(at::kMeta));
}

at::Tensor ints(std::vector<std::int64_t> values) { return at::tensor(values, at::kInt); }

HostTensor host(const at::Tensor& tensor) { return host_tensor_from_torch(tensor); }

std::vector<std::int64_t> values_of(const HostTensor& tensor) { return tensor.to_integers(); }

// A cache of `pages` pages of 2 keys, 1 head of 1 channel, page p holding p*10 and p*10+1.
at::Tensor numbered_cache(std::int64_t pages) {
  return (at::arange(pages * 2, at::kFloat) + at::arange(pages, at::kFloat).repeat_interleave(2) * 8)
      .view({pages, 2, 1, 1});
}

}  // namespace

TEST_CASE("ragged map: the job's thread plans every form's copies from shapes alone, reading no value") {
  const at::Tensor q = meta({5, 4, 16}), q_dense = meta({3, 1, 4, 16});
  const at::Tensor pages = meta({10, 4, 2, 16}), packed = meta({20, 2, 16}), cache = meta({3, 12, 2, 16});
  const at::Tensor offsets = meta({4}, at::kInt), lengths = meta({3}, at::kInt), table = meta({3, 6}, at::kInt);
  RaggedArguments paged{&q, &pages, &pages, &offsets, nullptr, &lengths, &table};
  const auto a = plan_ragged_copies(paged);
  REQUIRE(a);
  CHECK(a->layout.keys == RaggedLayout::Keys::paged);
  CHECK(a->k.sizes().vec() == std::vector<std::int64_t>{18, 4, 2, 16});  // every slot of the table: the bound
  CHECK(a->layout.page_size == 4);
  CHECK(a->layout.cache_pages == 10);
  CHECK(a->kv_gathered);  // pages gathered for capture alone: copied to the host as they are
  RaggedArguments packed_keys{&q, &packed, &packed, &offsets, &offsets, nullptr, nullptr};
  CHECK(plan_ragged_copies(packed_keys)->layout.keys == RaggedLayout::Keys::packed);
  RaggedArguments dense_cache{&q_dense, &cache, &cache, nullptr, nullptr, &lengths, nullptr};
  const auto c = plan_ragged_copies(dense_cache);
  REQUIRE(c);
  CHECK(c->layout.keys == RaggedLayout::Keys::dense_cache);
  CHECK(c->layout.dense_query);
  CHECK(c->q.sizes().vec() == std::vector<std::int64_t>{3, 4, 16});
  CHECK(c->k.sizes().vec() == cache.sizes().vec());  // the cache whole: its keys used are values
  CHECK_FALSE(c->kv_gathered);  // the job's own cache, which it writes next: cloned
  const at::Tensor starts = meta({4}, at::kInt), indices = meta({7}, at::kInt), last = meta({3}, at::kInt);
  RaggedArguments flashinfer{&q, &pages, &pages, &offsets};
  flashinfer.page_starts = &starts, flashinfer.page_indices = &indices, flashinfer.last_page_lengths = &last;
  const auto d = plan_ragged_copies(flashinfer);
  REQUIRE(d);
  CHECK(d->layout.keys == RaggedLayout::Keys::page_list);
  CHECK(d->k.size(0) == 7);
  CHECK(d->kv_gathered);
  // A dense call, and forms not recognised, are not ragged.
  RaggedArguments dense{&q_dense, &cache, &cache};
  CHECK_FALSE(plan_ragged_copies(dense));
  RaggedArguments three_dim_pages{&q, &packed, &packed, &offsets, nullptr, &lengths, &table};
  CHECK_FALSE(plan_ragged_copies(three_dim_pages));
}

TEST_CASE("ragged map: a paged cache is cut to the pages read, in id order, its table renumbered") {
  // Sequences read pages (6, 1, 3), (8) and (2, 9) of 2 keys: 5, 1 and 3 keys; slots past them
  // hold garbage (-1, 99) that the copies clamp and the record leaves out.
  const at::Tensor cache = numbered_cache(10);
  const at::Tensor table = ints({6, 1, 3, 8, -1, 99, 2, 9, 0}).view({3, 3});
  const at::Tensor q = at::zeros({3, 1, 1}), offsets = ints({0, 1, 2, 3}), lengths = ints({5, 1, 3});
  RaggedArguments arguments{&q, &cache, &cache, &offsets, nullptr, &lengths, &table};
  const RaggedCopies copies = *plan_ragged_copies(arguments);
  RaggedHostCopies copied{host(copies.q), host(copies.k), host(copies.v), host(copies.cu_seqlens_q), std::nullopt,
                          host(copies.used), host(copies.table)};
  const RaggedFields fields = ragged_fields(copies.layout, std::move(copied));
  // Pages read: 1, 2, 3, 6, 8, 9, in that order.
  const at::Tensor k = torch_view_of_host_tensor(fields.k);
  CHECK(at::equal(k, cache.index_select(0, at::tensor({1, 2, 3, 6, 8, 9}, at::kLong))));
  CHECK(values_of(*fields.block_table) == std::vector<std::int64_t>{3, 0, 2, 4, -1, -1, 1, 5, -1});
  CHECK(values_of(*fields.seqused_k) == std::vector<std::int64_t>{5, 1, 3});
  CHECK(fields.block_table->dtype == DType::int32);
  // Key counts from cu_seqlens_k where the call gives no seqused_k.
  const at::Tensor key_offsets = ints({0, 5, 6, 9});
  RaggedArguments by_offsets{&q, &cache, &cache, &offsets, &key_offsets, nullptr, &table};
  const RaggedCopies again = *plan_ragged_copies(by_offsets);
  RaggedHostCopies copied_again{host(again.q), host(again.k), host(again.v), host(again.cu_seqlens_q),
                                host(again.cu_seqlens_k), std::nullopt, host(again.table)};
  CHECK(values_of(*ragged_fields(again.layout, std::move(copied_again)).seqused_k) == std::vector<std::int64_t>{5, 1, 3});
  // A slot read that lists no page of the cache is named, not read past the cache.
  const at::Tensor bad = ints({6, 1, 30, 8, 0, 0, 2, 9, 0}).view({3, 3});
  RaggedArguments outside{&q, &cache, &cache, &offsets, nullptr, &lengths, &bad};
  const RaggedCopies broken = *plan_ragged_copies(outside);
  RaggedHostCopies copied_broken{host(broken.q), host(broken.k), host(broken.v), host(broken.cu_seqlens_q),
                                 std::nullopt, host(broken.used), host(broken.table)};
  CHECK_THROWS_WITH(ragged_fields(broken.layout, std::move(copied_broken)),
                    Catch::Matchers::ContainsSubstring("outside its cache of 10 pages"));
}

TEST_CASE("ragged map: FlashInfer's page list and a dense cache, as the record holds them") {
  const at::Tensor cache = numbered_cache(10);
  const at::Tensor q = at::zeros({3, 1, 1}), offsets = ints({0, 1, 2, 3});
  // Sequence 0 reads pages 4, 7 (its last holding 1 key), sequence 1 none, sequence 2 page 4 (2 keys).
  const at::Tensor starts = ints({0, 2, 2, 3}), indices = ints({4, 7, 4, 5, 5}), last = ints({1, 0, 2});
  RaggedArguments flashinfer{&q, &cache, &cache, &offsets};
  flashinfer.page_starts = &starts, flashinfer.page_indices = &indices, flashinfer.last_page_lengths = &last;
  const RaggedCopies copies = *plan_ragged_copies(flashinfer);
  RaggedHostCopies copied{host(copies.q), host(copies.k), host(copies.v), host(copies.cu_seqlens_q)};
  copied.table = host(copies.table), copied.page_starts = host(copies.page_starts);
  copied.last_page_lengths = host(copies.last_page_lengths);
  const RaggedFields fields = ragged_fields(copies.layout, std::move(copied));
  CHECK(at::equal(torch_view_of_host_tensor(fields.k), cache.index_select(0, at::tensor({4, 7}, at::kLong))));
  CHECK(values_of(*fields.block_table) == std::vector<std::int64_t>{0, 1, -1, -1, 0, -1});
  CHECK(values_of(*fields.seqused_k) == std::vector<std::int64_t>{3, 0, 2});
  // A dense (b, s_cache, h, d) cache of which sequence b uses its first used[b] keys; the query
  // (b, 1, h, d) packed, its offsets from its shape.
  const at::Tensor dense = at::arange(2 * 4, at::kFloat).view({2, 4, 1, 1}), used = ints({3, 1});
  const at::Tensor query = at::zeros({2, 1, 1, 1});
  RaggedArguments dense_cache{&query, &dense, &dense, nullptr, nullptr, &used};
  const RaggedCopies planned = *plan_ragged_copies(dense_cache);
  RaggedHostCopies from_cache{host(planned.q), host(planned.k), host(planned.v)};
  from_cache.used = host(planned.used);
  const RaggedFields packed = ragged_fields(planned.layout, std::move(from_cache));
  CHECK(packed.k.to_integers() == std::vector<std::int64_t>{0, 1, 2, 4});
  CHECK(values_of(*packed.cu_seqlens_k) == std::vector<std::int64_t>{0, 3, 4});
  CHECK(values_of(packed.cu_seqlens_q) == std::vector<std::int64_t>{0, 1, 2});
  CHECK(packed.q.shape == std::vector<std::int64_t>{2, 1, 1});
}
