// FLOP and byte counts, checked against counts done by hand.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>

#include "replay/judge/attention_work.h"

using namespace attnreplay;
using Catch::Matchers::WithinRel;

TEST_CASE("full attention counts every pair for both GEMMs") {
  // 2 * b * h * s_q * s_kv * (d_qk + d_vo) = 2 * 1 * 4 * 1000 * 1000 * 128
  const AttentionShape s{1, 4, 4, 1000, 1000, 64, 64};
  const AttentionWork w = attention_work(s, false, CausalAlignment::top_left, DType::bfloat16, DType::bfloat16);
  CHECK_THAT(w.flops, WithinRel(1.024e9, 1e-12));
  // Q, K, V, O: 4 tensors of 1*4*1000*64 bf16 elements
  CHECK_THAT(w.bytes, WithinRel(4 * 256000 * 2.0, 1e-12));
  CHECK_THAT(w.arithmetic_intensity(), WithinRel(500.0, 1e-12));
}

TEST_CASE("square causal is half of full, for either alignment") {
  CHECK(attended_pairs(1000, 1000, true, CausalAlignment::top_left) == 500000.0);
  CHECK(attended_pairs(1000, 1000, true, CausalAlignment::bottom_right) == 500000.0);
}

TEST_CASE("bottom-right causal cross attention counts s_q*(2*s_kv - s_q)/2") {
  // 100 queries at the end of 300 keys: row i sees 200 + i keys; the peers' convention counts the
  // diagonal half: 100*200 + 100*100/2 = 25000.
  CHECK(attended_pairs(100, 300, true, CausalAlignment::bottom_right) == 25000.0);
  // More queries than keys: only the last s_kv rows see keys, a triangle of 300*300/2.
  CHECK(attended_pairs(500, 300, true, CausalAlignment::bottom_right) == 45000.0);
}

TEST_CASE("top-left causal cross attention") {
  // Row i sees keys 0..i: a triangle of 100 rows.
  CHECK(attended_pairs(100, 300, true, CausalAlignment::top_left) == 5000.0);
  // 500 queries, 300 keys: a 300-row triangle, then 200 rows that see all 300 keys.
  CHECK(attended_pairs(500, 300, true, CausalAlignment::top_left) == 45000.0 + 60000.0);
}

TEST_CASE("GQA reads fewer K/V bytes but does the same FLOPs per query head") {
  const AttentionShape gqa{2, 8, 2, 16, 32, 64, 64};
  const AttentionWork w = attention_work(gqa, false, CausalAlignment::top_left, DType::float16, DType::float16);
  CHECK(w.flops == 2.0 * 2 * 8 * 16 * 32 * 128);
  // Q: 2*8*16*64, K and V: 2*2*32*64 each, O: 2*8*16*64; 2 bytes each
  CHECK(w.bytes == (16384.0 + 8192 + 8192 + 16384) * 2);
}

TEST_CASE("d_vo != d_qk: the second GEMM and O use d_vo") {
  const AttentionShape s{1, 1, 1, 10, 20, 192, 128};
  const AttentionWork w = attention_work(s, false, CausalAlignment::top_left, DType::float32, DType::float32);
  CHECK(w.flops == 2.0 * 10 * 20 * (192 + 128));
  // Q 10*192, K 20*192, V 20*128, O 10*128, 4 bytes each
  CHECK(w.bytes == (1920.0 + 3840 + 2560 + 1280) * 4);
}

TEST_CASE("rates use decimal units") {
  AttentionWork w;
  w.flops = 2e12;
  w.bytes = 3e9;
  CHECK(w.tflops(0.5) == 4.0);
  CHECK(w.gbytes_per_s(0.5) == 6.0);
}

namespace {

// A (batch, 2 heads, s, s) bf16 call with a bool mask (batch, 1, s, s) where visible(b, i, j).
template <typename Visible>
AttentionCall masked_call(std::int64_t batch, std::int64_t s, Visible visible) {
  AttentionCall call;
  call.q = call.k = call.v = HostTensor::allocate(DType::bfloat16, {batch, 2, s, 16});
  std::vector<double> values;
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t i = 0; i < s; ++i)
      for (std::int64_t j = 0; j < s; ++j) values.push_back(visible(b, i, j) ? 1.0 : 0.0);
  call.mask = HostTensor::from_doubles(DType::boolean, {batch, 1, s, s}, values);
  return call;
}

}  // namespace

TEST_CASE("a mask read as structure counts the pairs it leaves: a causal one as is_causal does") {
  const AttentionCall causal = masked_call(1, 100, [](auto, auto i, auto j) { return j <= i; });
  AttentionCall flag = causal;
  flag.mask.reset();
  flag.is_causal = true;
  CHECK(attention_work(causal).flops == attention_work(flag).flops);
  // A left-padded batch counts as its sequences unpadded: (100 - pad)^2 / 2 causal pairs each.
  const std::int64_t pads[] = {0, 30, 90};
  const AttentionCall padded = masked_call(3, 100, [&](auto b, auto i, auto j) { return j <= i && j >= pads[b]; });
  const double pairs = (100.0 * 100 + 70.0 * 70 + 10.0 * 10) / 2;
  CHECK_THAT(attention_work(padded).flops, WithinRel(2.0 * 2 * pairs * 32, 1e-12));
  CHECK_THAT(attention_work(padded).attended_pairs_per_head, WithinRel(pairs / 3, 1e-12));
  // A mask that stays dense counts every pair: kernels compute the masked scores.
  const AttentionCall holes = masked_call(1, 100, [](auto, auto i, auto j) { return (i + j) % 3 != 0; });
  CHECK(attention_work(holes).flops == 2.0 * 2 * 100 * 100 * 32);
}
