// Ragged and paged batches in the record (formats/ragged_call.cpp) and the reference over them.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <random>

#include "call_fixtures.h"
#include "formats/errors.h"
#include "kernels/reference.h"

using namespace attnreplay;
using Catch::Matchers::ContainsSubstring;

namespace {

HostTensor indices(std::vector<std::int64_t> shape, const std::vector<double>& values) {
  return HostTensor::from_doubles(DType::int32, std::move(shape), values);
}

constexpr std::int64_t kHeads = 4, kHeadsKv = 2, kDim = 8, kPageSize = 3;

// Three sequences of (4, 6), (1, 2) and (5, 5) queries and keys, packed; GQA; bottom-right causal.
AttentionCall packed_call() {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal;
  auto tensor = [&](std::vector<std::int64_t> shape) {
    std::int64_t count = 1;
    for (std::int64_t dim : shape) count *= dim;
    std::vector<double> values(static_cast<std::size_t>(count));
    for (double& v : values) v = normal(rng);
    return HostTensor::from_doubles(DType::float32, std::move(shape), values);
  };
  AttentionCall call;
  call.source = "ragged.h5";
  call.call_index = 3;
  call.layout = Layout::thd;
  call.is_causal = true;
  call.causal_alignment = CausalAlignment::bottom_right;
  call.q = tensor({10, kHeads, kDim});
  call.k = tensor({13, kHeadsKv, kDim});
  call.v = tensor({13, kHeadsKv, kDim});
  call.cu_seqlens_q = indices({4}, {0, 4, 5, 10});
  call.cu_seqlens_k = indices({4}, {0, 6, 8, 13});
  return call;
}

// The same keys in pages of 3, laid out out of order among unused pages.
AttentionCall paged_call(const AttentionCall& packed) {
  AttentionCall call = packed;
  const std::int64_t pages = 8;
  HostTensor k = HostTensor::allocate(DType::float32, {pages, kPageSize, kHeadsKv, kDim});
  HostTensor v = HostTensor::allocate(DType::float32, {pages, kPageSize, kHeadsKv, kDim});
  std::fill(k.mutable_data(), k.mutable_data() + k.nbytes(), std::byte{0x7f});  // unused pages hold NaNs
  std::fill(v.mutable_data(), v.mutable_data() + v.nbytes(), std::byte{0x7f});
  // Sequence 0's keys 0..5 in pages 5, 1; sequence 1's 6..7 in page 6; sequence 2's 8..12 in pages 0, 3.
  const std::vector<std::vector<std::int64_t>> owned = {{5, 1}, {6}, {0, 3}};
  const std::vector<std::int64_t> first_key = {0, 6, 8}, count = {6, 2, 5};
  const std::size_t row = static_cast<std::size_t>(kHeadsKv * kDim) * 4;
  for (std::size_t b = 0; b < owned.size(); ++b)
    for (std::int64_t t = 0; t < count[b]; ++t) {
      const std::int64_t page = owned[b][static_cast<std::size_t>(t / kPageSize)];
      const std::size_t to = static_cast<std::size_t>(page * kPageSize + t % kPageSize) * row;
      const std::size_t from = static_cast<std::size_t>(first_key[b] + t) * row;
      std::memcpy(k.mutable_data() + to, packed.k.data() + from, row);
      std::memcpy(v.mutable_data() + to, packed.v.data() + from, row);
    }
  call.k = k, call.v = v;
  call.cu_seqlens_k.reset();
  call.block_table = indices({3, 2}, {5, 1, 6, -1, 0, 3});
  call.seqused_k = indices({3}, {6, 2, 5});
  return call;
}

}  // namespace

TEST_CASE("a ragged call's shape is its packed view and its sequences come from the offsets") {
  const AttentionCall call = packed_call();
  const AttentionShape s = call.shape();
  CHECK(s == AttentionShape{1, kHeads, kHeadsKv, 10, 13, kDim, kDim});
  const auto sequences = call.sequences();
  REQUIRE(sequences.size() == 3);
  CHECK(sequences[0] == AttentionCall::Sequence{0, 4, 0, 6});
  CHECK(sequences[1] == AttentionCall::Sequence{4, 1, 6, 2});
  CHECK(sequences[2] == AttentionCall::Sequence{5, 5, 8, 5});
  CHECK(call.describe_batch() == "a ragged batch of 3 sequences (queries 1..5, keys 2..6)");
  const AttentionCall paged = paged_call(call);
  CHECK(paged.shape().seq_kv == 8 * kPageSize);
  CHECK(paged.sequences()[2] == AttentionCall::Sequence{5, 5, 0, 5});
  CHECK(paged.describe_batch() == "a ragged batch of 3 sequences (queries 1..5, keys 2..6), paged (page size 3, 8 pages)");
}

TEST_CASE("a sequence of a paged call is the dense call of its keys, gathered from its pages") {
  const AttentionCall packed = packed_call();
  const AttentionCall paged = paged_call(packed);
  for (std::size_t b = 0; b < 3; ++b) {
    const AttentionCall from_pages = paged.sequence_call(b, paged.sequences());
    const AttentionCall from_rows = packed.sequence_call(b, packed.sequences());
    CHECK(from_pages.layout == Layout::bshd);
    CHECK(from_pages.k.shape == from_rows.k.shape);
    CHECK(*from_pages.k.bytes == *from_rows.k.bytes);
    CHECK(*from_pages.v.bytes == *from_rows.v.bytes);
    CHECK(*from_pages.q.bytes == *from_rows.q.bytes);
  }
}

TEST_CASE("a sequence without data has the shapes alone, for kernels to decide on") {
  const AttentionCall paged = paged_call(packed_call());
  const AttentionCall one = paged.sequence_call(2, paged.sequences(), /*with_data=*/false);
  CHECK(one.shape() == AttentionShape{1, kHeads, kHeadsKv, 5, 5, kDim, kDim});
  CHECK(one.q.data() == nullptr);
  CHECK(one.k.data() == nullptr);
  CHECK(one.layout == Layout::bshd);
  CHECK(!one.block_table);
}

TEST_CASE("the reference of a ragged call is each sequence's, paged or packed alike") {
  const AttentionCall packed = packed_call();
  const ReferenceOutput whole = reference_attention(packed);
  REQUIRE(whole.values.size() == static_cast<std::size_t>(kHeads * 10 * kDim));
  const auto sequences = packed.sequences();
  for (std::size_t b = 0; b < sequences.size(); ++b) {
    const ReferenceOutput one = reference_attention(packed.sequence_call(b, sequences));
    for (std::int64_t h = 0; h < kHeads; ++h)
      for (std::int64_t i = 0; i < sequences[b].q_len; ++i)
        for (std::int64_t d = 0; d < kDim; ++d)
          CHECK(whole.at(0, h, static_cast<std::size_t>(sequences[b].q_begin + i), d) == one.at(0, h, static_cast<std::size_t>(i), d));
  }
  const ReferenceOutput paged = reference_attention(paged_call(packed));
  CHECK(paged.values == whole.values);
  // Sampled rows map into their sequences.
  const ReferenceOutput sampled = reference_attention(packed, {1, 4, 9});
  for (std::int64_t h = 0; h < kHeads; ++h)
    for (std::int64_t d = 0; d < kDim; ++d) {
      CHECK(sampled.at(0, h, 0, d) == whole.at(0, h, 1, d));
      CHECK(sampled.at(0, h, 1, d) == whole.at(0, h, 4, d));
      CHECK(sampled.at(0, h, 2, d) == whole.at(0, h, 9, d));
    }
}

TEST_CASE("a sequence with more queries than keys has rows that see none, marked apart") {
  AttentionCall call = packed_call();
  call.seqused_k = indices({3}, {6, 2, 2});  // sequence 2: 5 queries, 2 keys, bottom-right
  const ReferenceOutput out = reference_attention(call);
  REQUIRE(!out.no_key.empty());
  std::int64_t marked = 0;
  for (auto flag : out.no_key) marked += flag;
  CHECK(marked == 3 * kHeads);  // its first 3 rows
  CHECK(out.fully_masked_rows == 3 * kHeads);
  CHECK(out.at(0, 0, 5, 0) == 0.0);
}

TEST_CASE("bad ragged fields are named with the call") {
  AttentionCall call = packed_call();
  auto fails_with = [](const AttentionCall& bad, const std::string& words) {
    CHECK_THROWS_WITH(bad.sequences(), ContainsSubstring("ragged.h5: call 3") && ContainsSubstring(words));
  };
  SECTION("offsets that do not end at q's rows") {
    call.cu_seqlens_q = indices({4}, {0, 4, 5, 9});
    fails_with(call, "field 'cu_seqlens_q': ends at 9, but q has 10 rows");
  }
  SECTION("decreasing offsets") {
    call.cu_seqlens_k = indices({4}, {0, 8, 6, 13});
    fails_with(call, "field 'cu_seqlens_k': decreases at sequence 1");
  }
  SECTION("more keys used than a sequence has") {
    call.seqused_k = indices({3}, {7, 2, 5});
    fails_with(call, "field 'seqused_k': sequence 0 uses 7 keys, but has 6");
  }
  SECTION("a page outside the cache") {
    AttentionCall paged = paged_call(call);
    paged.block_table = indices({3, 2}, {5, 1, 6, -1, 0, 9});
    fails_with(paged, "field 'block_table': sequence 2's page 1 is 9, but k holds pages 0..7");
  }
  SECTION("a mask") {
    call.mask = HostTensor::from_doubles(DType::boolean, {1}, std::vector<double>{1});
    fails_with(call, "field 'mask': a ragged call takes no mask");
  }
  SECTION("packed keys without offsets") {
    call.cu_seqlens_k.reset();
    fails_with(call, "field 'cu_seqlens_k': a ragged call with packed keys needs their offsets");
  }
  SECTION("a 4-dim q") {
    call.q.shape = {1, 10, kHeads, kDim};
    fails_with(call, "field 'q': expected 3 dims (tokens, heads, dim)");
  }
}
