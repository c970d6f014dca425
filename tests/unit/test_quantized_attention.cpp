// The CPU emulations of attnreplay's own kernels (kernels/quantized_attention.cpp) against
// docs/quantized.md: quantization steps on tensors worked by hand, and each emulation against the
// fp64 reference on random inputs, within bands observed here (kept beside each case).
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/emulated_kernel.h"
#include "kernels/kernel.h"
#include "kernels/quantized_attention.h"
#include "kernels/quantized_kernel.h"
#include "kernels/reference.h"
#include "replay/judge/compare.h"
#include "replay/run/generate.h"

using namespace attnreplay;
using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;

namespace {

HeadMatrix matrix(std::int64_t rows, std::int64_t cols, std::vector<float> values) {
  HeadMatrix m(rows, cols);
  m.values = std::move(values);
  return m;
}

// A zero (rows x cols) matrix with the given (row, col) entries set.
HeadMatrix sparse(std::int64_t rows, std::int64_t cols,
                  std::vector<std::tuple<std::int64_t, std::int64_t, float>> entries) {
  HeadMatrix m(rows, cols);
  for (auto [i, c, value] : entries) m.row(i)[c] = value;
  return m;
}

struct GeneratedCase {
  std::string name;
  AttentionShape shape;
  bool causal = false;
  CausalAlignment alignment = CausalAlignment::top_left;
  Layout layout = Layout::bhsd;
  DType dtype = DType::bfloat16;
};

AttentionCall generated(const GeneratedCase& c, std::uint64_t seed = 7) {
  GeneratedCallSpec spec;
  spec.shape = c.shape;
  spec.dtype = c.dtype;
  spec.layout = c.layout;
  spec.is_causal = c.causal;
  spec.causal_alignment = c.alignment;
  spec.seed = seed;
  return generate_call(spec);
}

// Shapes that exercise GQA, both causal alignments, s_q != s_kv, lengths that are not multiples of
// 128 (or of 64 and 16), bshd, fp16, a head dim the CUDA kernels pad (80), and Q·Kᵀ wider than V
// (192 and 128, as DeepSeek's MLA has them).
std::vector<GeneratedCase> generated_cases() {
  return {
      {"b2 h4 s300 d64", {2, 4, 4, 300, 300, 64, 64}},
      {"GQA 4/2, sq 200 skv 300, causal top_left", {1, 4, 2, 200, 300, 64, 64}, true, CausalAlignment::top_left},
      {"causal bottom_right, sq 100 skv 300, bshd", {1, 2, 2, 100, 300, 64, 64}, true, CausalAlignment::bottom_right,
       Layout::bshd},
      {"fp16 GQA 6/3, d128, s 257", {1, 6, 3, 257, 257, 128, 128}, false, CausalAlignment::top_left, Layout::bhsd,
       DType::float16},
      {"GQA 4/2, d80, s 130, bshd", {1, 4, 2, 130, 130, 80, 80}, false, CausalAlignment::top_left, Layout::bshd},
      {"d_qk 192, d_vo 128, sq 16 skv 300, causal bottom_right", {1, 4, 4, 16, 300, 192, 128}, true,
       CausalAlignment::bottom_right},
  };
}

ErrorStats against_reference(const HostTensor& output, const AttentionCall& call) {
  return compare_to_reference(output, reference_attention(call));
}

// Adds `offset[c]` to every key's channel c, rounded back to the call's dtype: K with channel-mean
// outliers, as real models' K often has.
AttentionCall with_key_channel_offsets(AttentionCall call, const std::vector<double>& offset) {
  std::vector<double> k = call.k.to_doubles();
  const auto dim = static_cast<std::size_t>(call.k.shape.back());
  for (std::size_t i = 0; i < k.size(); ++i) k[i] += offset[i % dim];
  call.k = HostTensor::from_doubles(call.k.dtype, call.k.shape, k);
  return call;
}

const QuantizedKind kAllKinds[] = {QuantizedKind::flash, QuantizedKind::sage1_int8, QuantizedKind::sage2_int8_fp8,
                                   QuantizedKind::fa3_fp8};

}  // namespace

// ---- Options ----

TEST_CASE("quantized options: flag spellings parse back, and rerun flags name only non-defaults", "[quant]") {
  for (auto g : {QuantGranularity::per_block, QuantGranularity::per_warp, QuantGranularity::per_thread})
    CHECK(parse_quant_granularity(to_string(g)) == g);
  for (auto a : {PvAccum::fp32, PvAccum::fp32_fp32, PvAccum::fp32_fp16}) CHECK(parse_pv_accum(to_string(a)) == a);
  for (auto s : {Fp8Scale::per_tensor, Fp8Scale::per_head}) CHECK(parse_fp8_scale(to_string(s)) == s);
  CHECK(to_string(PvAccum::fp32_fp16) == "fp32+fp16");
  CHECK_FALSE(parse_quant_granularity("per_row"));
  CHECK_FALSE(parse_pv_accum("fp16"));
  CHECK_FALSE(parse_fp8_scale("per_block"));
  CHECK(quant_granularity_names() == std::vector<std::string>{"per_block", "per_warp", "per_thread"});
}

// ---- Element conversions ----

TEST_CASE("quantized elements: fast fp16 and e4m3 rounding equal formats/dtype.h bit for bit", "[quant]") {
  std::mt19937 rng(3);
  std::vector<float> values = {0.0f, -0.0f, 1.0f, 0x1p-14f, 0x1p-15f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 65504.0f,
                               65519.0f, 65520.0f, 0x1p-6f, 0x1p-7f, 0x1p-9f, 0x1p-10f, 0x1.8p-10f, 440.0f, 447.9f,
                               448.0f, 1.0625f, 1.1875f, 0.3f};
  for (int i = 0; i < 200000; ++i) {
    // Magnitudes spread over every binade either format has, both signs.
    const float magnitude = std::ldexp(std::uniform_real_distribution<float>(1.0f, 2.0f)(rng),
                                       std::uniform_int_distribution<int>(-30, 17)(rng));
    values.push_back(rng() & 1u ? magnitude : -magnitude);
  }
  for (float value : values) {
    INFO("value " << value);
    CHECK(std::bit_cast<std::uint32_t>(round_to_float16(value)) ==
          std::bit_cast<std::uint32_t>(float16_bits_to_float(float_to_float16_bits(value))));
    // satfinite: dtype.h's conversion gives NaN past 464, as torch's cast does, so clamp first.
    const float clamped = std::clamp(value, -448.0f, 448.0f);
    CHECK(std::bit_cast<std::uint32_t>(round_to_e4m3(value)) ==
          std::bit_cast<std::uint32_t>(e4m3fn_bits_to_float(float_to_e4m3fn_bits(clamped))));
  }
}

TEST_CASE("quantized elements: e4m3 saturates at +-448 and keeps NaN", "[quant]") {
  CHECK(round_to_e4m3(448.0f) == 448.0f);
  CHECK(round_to_e4m3(449.0f) == 448.0f);
  CHECK(round_to_e4m3(464.0f) == 448.0f);  // torch's cast would give NaN from here on
  CHECK(round_to_e4m3(500.0f) == 448.0f);
  CHECK(round_to_e4m3(1e30f) == 448.0f);
  CHECK(round_to_e4m3(-1000.0f) == -448.0f);
  CHECK(round_to_e4m3(std::numeric_limits<float>::infinity()) == 448.0f);
  CHECK(std::isnan(round_to_e4m3(std::numeric_limits<float>::quiet_NaN())));
  // 3 mantissa bits: 1.0625 is halfway between 1 and 1.125 and goes to the even 1.
  CHECK(round_to_e4m3(1.0625f) == 1.0f);
  CHECK(round_to_e4m3(1.1875f) == 1.25f);
  // Subnormals are multiples of 2^-9.
  CHECK(round_to_e4m3(0x1.8p-9f) == 0x1p-8f);
  CHECK(round_to_e4m3(0x1p-10f) == 0.0f);
}

TEST_CASE("quantized elements: INT8 codes round half to even and clamp to +-127", "[quant]") {
  CHECK(int8_code(2.5f, 1.0f) == 2);
  CHECK(int8_code(3.5f, 1.0f) == 4);
  CHECK(int8_code(-2.5f, 1.0f) == -2);
  CHECK(int8_code(-0.5f, 1.0f) == 0);
  CHECK(int8_code(0.5f, 2.0f) == 1);  // the second argument multiplies
  CHECK(int8_code(63.5f, 2.0f) == 127);
  CHECK(int8_code(127.6f, 1.0f) == 127);
  CHECK(int8_code(-200.0f, 1.0f) == -127);
  CHECK(int8_code(5.0f, 0.0f) == 0);  // an all-zero group has inverse 0
  CHECK(int8_code(std::nanf(""), 1.0f) == 0);  // a NaN (max |x| passes over it) codes 0
  CHECK(int8_code(0.0f, INFINITY) == 0);       // 0 times an overflowed inverse is NaN
  CHECK(int8_code(-1e-40f, INFINITY) == -127);
  CHECK(int8_inverse_for(254.0f) == 0.5f);
  CHECK(int8_inverse_for(0.0f) == 0.0f);
  // The definition multiplies by 127 / amax: here x / (amax / 127) would round to 35, not 34.
  const float amax = 0x1.0df358p-2f, x = 0x1.255506p-4f;
  CHECK(int8_code(x, int8_inverse_for(amax)) == 34);
  const Int8Matrix m = quantize_int8(matrix(1, 2, {amax, x}), QuantGranularity::per_block, Int8Operand::query);
  CHECK(std::vector<int>{m.codes[0], m.codes[1]} == std::vector<int>{127, 34});
}

// ---- Quantization steps ----

TEST_CASE("quantized steps: Q's INT8 groups, scales and codes for each granularity", "[quant]") {
  // 32 rows (two 16-row warp tiles of one 64-row block), 2 channels; amaxes chosen so that every
  // scale is exact: 127 -> 1, 254 -> 2, 63.5 -> 0.5.
  const HeadMatrix q = sparse(32, 2, {{0, 0, 127.0f}, {0, 1, 2.5f}, {8, 0, 3.5f}, {8, 1, -1.5f},
                                      {16, 0, 254.0f}, {16, 1, 5.0f}, {25, 0, -63.5f}, {25, 1, 0.75f}});
  auto codes_of = [](const Int8Matrix& m, std::int64_t row) {
    return std::vector<int>{m.codes[row * 2], m.codes[row * 2 + 1]};
  };
  using V = std::vector<int>;

  SECTION("per_block: one group for the 64-row block, scale 2") {
    const Int8Matrix m = quantize_int8(q, QuantGranularity::per_block, Int8Operand::query);
    CHECK(m.group_amax == std::vector<float>{254.0f});
    CHECK(m.group_scale == std::vector<float>{2.0f});
    CHECK(codes_of(m, 0) == V{64, 1});    // 63.5 -> 64 (even), 1.25 -> 1
    CHECK(codes_of(m, 8) == V{2, -1});    // 1.75, -0.75
    CHECK(codes_of(m, 16) == V{127, 2});  // 2.5 -> 2 (even)
    CHECK(codes_of(m, 25) == V{-32, 0});  // -31.75, 0.375
  }
  SECTION("per_warp: one group per 16-row warp tile") {
    const Int8Matrix m = quantize_int8(q, QuantGranularity::per_warp, Int8Operand::query);
    CHECK(m.group_amax == std::vector<float>{127.0f, 254.0f});
    CHECK(m.group_scale == std::vector<float>{1.0f, 2.0f});
    CHECK(m.row_scale[15] == 1.0f);
    CHECK(m.row_scale[16] == 2.0f);
    CHECK(codes_of(m, 0) == V{127, 2});
    CHECK(codes_of(m, 8) == V{4, -2});  // 3.5 -> 4, -1.5 -> -2 (both even)
    CHECK(codes_of(m, 16) == V{127, 2});
    CHECK(codes_of(m, 25) == V{-32, 0});
  }
  SECTION("per_thread: rows r and r + 8 of each warp tile") {
    const Int8Matrix m = quantize_int8(q, QuantGranularity::per_thread, Int8Operand::query);
    REQUIRE(m.group_amax.size() == 16);
    CHECK(int8_group_of_row(QuantGranularity::per_thread, Int8Operand::query, 8) == 0);
    CHECK(int8_group_of_row(QuantGranularity::per_thread, Int8Operand::query, 25) == 9);
    CHECK(m.group_amax[0] == 127.0f);   // rows 0 and 8
    CHECK(m.group_amax[8] == 254.0f);   // rows 16 and 24
    CHECK(m.group_amax[9] == 63.5f);    // rows 17 and 25
    CHECK(m.group_amax[1] == 0.0f);     // rows 1 and 9: all zero, scale 0
    CHECK(m.group_scale[1] == 0.0f);
    CHECK(codes_of(m, 0) == V{127, 2});
    CHECK(codes_of(m, 8) == V{4, -2});
    CHECK(codes_of(m, 16) == V{127, 2});
    CHECK(codes_of(m, 25) == V{-127, 2});  // scale 0.5: 1.5 -> 2 (even)
    CHECK(codes_of(m, 1) == V{0, 0});
  }
}

TEST_CASE("quantized steps: K's INT8 groups are 128-key blocks, or keys equal mod 8 within one", "[quant]") {
  // 136 keys: a full block and a partial one of 8 keys.
  const HeadMatrix k =
      sparse(136, 1, {{3, 0, 127.0f}, {11, 0, -254.0f}, {5, 0, 63.5f}, {130, 0, 2.5f}, {131, 0, 127.0f}});
  for (auto granularity : {QuantGranularity::per_block, QuantGranularity::per_warp}) {
    const Int8Matrix m = quantize_int8(k, granularity, Int8Operand::key);
    CHECK(m.group_scale == std::vector<float>{2.0f, 1.0f});
    CHECK(int{m.codes[3]} == 64);
    CHECK(int{m.codes[11]} == -127);
    CHECK(int{m.codes[5]} == 32);  // 31.75
    CHECK(int{m.codes[130]} == 2);
    CHECK(int{m.codes[131]} == 127);
  }
  const Int8Matrix m = quantize_int8(k, QuantGranularity::per_thread, Int8Operand::key);
  REQUIRE(m.group_scale.size() == 16);
  CHECK(int8_group_of_row(QuantGranularity::per_thread, Int8Operand::key, 11) == 3);
  CHECK(int8_group_of_row(QuantGranularity::per_thread, Int8Operand::key, 131) == 11);
  CHECK(m.group_scale[3] == 2.0f);  // keys 3 and 11
  CHECK(m.group_scale[5] == 0.5f);  // key 5
  CHECK(int{m.codes[3]} == 64);
  CHECK(int{m.codes[5]} == 127);
  CHECK(int{m.codes[130]} == 127);  // alone in its group
  CHECK(int{m.codes[131]} == 127);
  CHECK(m.row_scale[131] == 1.0f);
}

TEST_CASE("quantized steps: K's channel means are removed in fp32", "[quant]") {
  HeadMatrix k = matrix(3, 2, {1.0f, 10.0f, 2.0f, 20.0f, 6.0f, 60.0f});
  const std::vector<float> means = channel_means(k);
  CHECK(means == std::vector<float>{3.0f, 30.0f});
  subtract_channel_means(k, means);
  CHECK(k.values == std::vector<float>{-2.0f, -20.0f, -1.0f, -10.0f, 3.0f, 30.0f});
  CHECK(channel_means(HeadMatrix(0, 2)) == std::vector<float>{0.0f, 0.0f});
}

TEST_CASE("quantized steps: K's channel sums run block by block, then over the blocks", "[quant]") {
  // 2^24 then 127 zeros, then 128 ones: key by key every 1 is lost to rounding (2^24 + 1 ties to
  // 2^24); summed within their block first, the ones make 128, which 2^24 + 128 keeps.
  HeadMatrix k(2 * kBlockK, 1);
  k.values[0] = 16777216.0f;
  for (std::int64_t j = kBlockK; j < 2 * kBlockK; ++j) k.values[static_cast<std::size_t>(j)] = 1.0f;
  CHECK(channel_means(k) == std::vector<float>{(16777216.0f + 128.0f) / 256.0f});
}

TEST_CASE("quantized steps: FP8 scales by amax / 448, per tensor or head and per channel of V", "[quant]") {
  CHECK(fp8_scale_for(448.0f) == 1.0f);
  CHECK(fp8_scale_for(0.0f) == 0.0f);
  const HeadMatrix x = matrix(2, 2, {224.0f, -448.0f, 1.0f, 100.0f});
  CHECK(fp8_inverse_for(224.0f) == 2.0f);
  CHECK(fp8_inverse_for(0.0f) == 0.0f);
  CHECK(quantize_fp8(x, 2.0f).values == std::vector<float>{448.0f, -448.0f, 2.0f, 192.0f});  // 200 -> 192
  CHECK(quantize_fp8(x, 0.0f).values == std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f});

  const Fp8PerChannel v8 = quantize_fp8_per_channel(matrix(2, 3, {1.0f, -2.0f, 0.0f, 0.5f, 4.0f, 0.0f}));
  CHECK(v8.channel_scale == std::vector<float>{1.0f / 448.0f, 4.0f / 448.0f, 0.0f});
  CHECK(v8.values.values == std::vector<float>{448.0f, -224.0f, 0.0f, 224.0f, 448.0f, 0.0f});
}

// ---- The emulations ----

TEST_CASE("quantized emulation: each kind against the fp64 reference, within its observed band", "[quant]") {
  // Observed with seed 7 on generated_cases() (standard normal inputs; bf16 and fp16 outputs):
  //   flash           cosine 0.999998..1,        rel_l2 0.0022 (bf16 output), 0.00027 (fp16)
  //   sage1-int8      cosine 0.999925..0.999949, rel_l2 0.0117..0.0122
  //   sage2-int8-fp8  cosine 0.99931..0.99945,   rel_l2 0.033..0.037
  //   fa3-fp8         cosine 0.99860..0.99896,   rel_l2 0.046..0.053
  // The bands leave room around those, and bound the error from below too: a quantized kind as
  // exact as flash has lost its quantization.
  struct Band {
    QuantizedKind kind;
    double min_cosine;
    double min_rel_l2, max_rel_l2;
  };
  const Band bands[] = {{QuantizedKind::flash, 0.99999, 0.0, 0.003},
                        {QuantizedKind::sage1_int8, 0.9998, 0.006, 0.02},
                        {QuantizedKind::sage2_int8_fp8, 0.999, 0.02, 0.05},
                        {QuantizedKind::fa3_fp8, 0.998, 0.03, 0.07}};
  for (const GeneratedCase& c : generated_cases()) {
    const AttentionCall call = generated(c);
    const ReferenceOutput reference = reference_attention(call);
    for (const Band& band : bands) {
      const HostTensor out = output_in_dtype(emulate_attention(call, band.kind, QuantOptions{}), c.dtype);
      const ErrorStats e = compare_to_reference(out, reference);
      INFO(c.name << ", " << to_string(band.kind) << ": cosine " << e.cosine << ", rel_l2 " << e.rel_l2);
      CHECK(e.nan_count == 0);
      CHECK(e.inf_count == 0);
      CHECK(e.cosine >= band.min_cosine);
      CHECK(e.rel_l2 >= band.min_rel_l2);
      CHECK(e.rel_l2 <= band.max_rel_l2);
    }
  }
}

TEST_CASE("quantized emulation: with every stage off, each kind is within fp32 rounding of the reference", "[quant]") {
  // Observed: rel_l2 1.8e-7..4.5e-7, max_abs up to 6.3e-7.
  const EmulationStages none{false, false, false};
  for (const GeneratedCase& c : generated_cases()) {
    const AttentionCall call = generated(c);
    const ReferenceOutput reference = reference_attention(call);
    for (QuantizedKind kind : kAllKinds) {
      const ErrorStats e = compare_to_reference(emulate_attention(call, kind, QuantOptions{}, none), reference);
      INFO(c.name << ", " << to_string(kind) << ": rel_l2 " << e.rel_l2 << ", max_abs " << e.max_abs);
      CHECK(e.rel_l2 <= 1e-6);
      CHECK(e.max_abs <= 2e-6);
    }
  }
}

TEST_CASE("quantized emulation: negative and zero softmax scales", "[quant]") {
  // The score is scaled inside exp2's fma, and m taken before: under a negative scale the row's
  // largest score comes from its least dot product; under a zero one every visible key weighs 1.
  for (const double scale : {-0.2, 0.0}) {
    GeneratedCase c = generated_cases()[1];  // GQA, causal: rows with hidden keys in partial blocks
    GeneratedCallSpec spec;
    spec.shape = c.shape, spec.dtype = c.dtype, spec.is_causal = true, spec.seed = 7, spec.scale = scale;
    const AttentionCall call = generate_call(spec);
    const ReferenceOutput reference = reference_attention(call);
    for (QuantizedKind kind : kAllKinds) {
      INFO("scale " << scale << ", " << to_string(kind));
      const ErrorStats exact =
          compare_to_reference(emulate_attention(call, kind, QuantOptions{}, {false, false, false}), reference);
      CHECK(exact.rel_l2 <= 1e-6);
      const ErrorStats quantized = compare_to_reference(emulate_attention(call, kind, QuantOptions{}), reference);
      CHECK(quantized.nan_count == 0);
      CHECK(quantized.cosine >= 0.998);
    }
  }
}

TEST_CASE("quantized emulation: each stage adds error only where the kind has that step", "[quant]") {
  const AttentionCall call = generated(generated_cases()[1]);
  const ReferenceOutput reference = reference_attention(call);
  const HostTensor plain = emulate_attention(call, QuantizedKind::flash, QuantOptions{}, {false, false, false});
  auto rel_l2 = [&](QuantizedKind kind, EmulationStages stages) {
    return compare_to_reference(emulate_attention(call, kind, QuantOptions{}, stages), reference).rel_l2;
  };
  auto same_as_plain = [&](QuantizedKind kind, EmulationStages stages) {
    const HostTensor out = emulate_attention(call, kind, QuantOptions{}, stages);
    return *out.bytes == *plain.bytes;
  };
  const EmulationStages qk_only{true, false, false}, p_only{false, true, false}, pv_only{false, false, true};
  // flash rounds only P; its Q, K and V are used as they are.
  CHECK(same_as_plain(QuantizedKind::flash, qk_only));
  CHECK(same_as_plain(QuantizedKind::flash, pv_only));
  CHECK(rel_l2(QuantizedKind::flash, p_only) > 1e-5);
  // sage1 has no P·V step of its own; fa3 and sage2 have all three.
  CHECK(rel_l2(QuantizedKind::sage1_int8, qk_only) > 1e-3);
  CHECK(rel_l2(QuantizedKind::sage1_int8, p_only) > 1e-5);
  CHECK(rel_l2(QuantizedKind::sage1_int8, pv_only) < 1e-6);
  for (QuantizedKind kind : {QuantizedKind::sage2_int8_fp8, QuantizedKind::fa3_fp8}) {
    INFO(to_string(kind));
    CHECK(rel_l2(kind, qk_only) > 1e-3);
    CHECK(rel_l2(kind, p_only) > 1e-3);
    CHECK(rel_l2(kind, pv_only) > 1e-3);
  }
}

TEST_CASE("quantized emulation: K smoothing leaves the unquantized result unchanged up to fp32 rounding", "[quant]") {
  GeneratedCase c = generated_cases()[0];
  std::vector<double> offsets(64);
  for (std::size_t i = 0; i < offsets.size(); ++i) offsets[i] = (i % 3 == 0) ? 6.0 : -0.5;
  const AttentionCall call = with_key_channel_offsets(generated(c), offsets);
  const EmulationStages none{false, false, false};
  // sage1 with every stage off is flash with fp32 P on K - mean (kept in fp32).
  const HostTensor smoothed = emulate_attention(call, QuantizedKind::sage1_int8, QuantOptions{}, none);
  const HostTensor plain = emulate_attention(call, QuantizedKind::flash, QuantOptions{}, none);
  const auto* a = reinterpret_cast<const float*>(smoothed.data());
  const auto* b = reinterpret_cast<const float*>(plain.data());
  double worst = 0;
  bool any_different = false;
  for (std::int64_t i = 0; i < plain.numel(); ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
    any_different |= a[i] != b[i];
  }
  INFO("largest difference " << worst);
  CHECK(worst <= 2e-6);
  CHECK(any_different);  // the scores really were computed from another K
  const auto means = prepare_attention_inputs(call, QuantizedKind::sage1_int8, QuantOptions{}).k_channel_means;
  REQUIRE(means.size() == 8);
  CHECK_THAT(means[0][0], WithinAbs(6.0, 0.3));
}

TEST_CASE("quantized emulation: smoothing K with outlier channel means improves INT8 accuracy", "[quant]") {
  // Real models' K carries large per-channel means; INT8's range per block is then mostly spent
  // on them. Observed (per_warp): sage1 rel_l2 0.0121 smoothed against 0.062 not; sage2 (whose
  // error is mostly its FP8 P·V) 0.037 against 0.071.
  const AttentionCall base = generated(generated_cases()[0]);
  std::vector<double> offsets(64, 0.0);
  for (std::size_t c = 0; c < offsets.size(); c += 8) offsets[c] = (c % 16 == 0) ? 24.0 : -16.0;
  const AttentionCall call = with_key_channel_offsets(base, offsets);
  const ReferenceOutput reference = reference_attention(call);
  QuantOptions smooth, raw;
  raw.k_smooth = false;
  const std::pair<QuantizedKind, double> gains[] = {{QuantizedKind::sage1_int8, 4.0},
                                                    {QuantizedKind::sage2_int8_fp8, 1.5}};
  for (const auto& [kind, gain] : gains) {
    const double with_smoothing = compare_to_reference(emulate_attention(call, kind, smooth), reference).rel_l2;
    const double without = compare_to_reference(emulate_attention(call, kind, raw), reference).rel_l2;
    INFO(to_string(kind) << ": rel_l2 " << with_smoothing << " smoothed, " << without << " not");
    CHECK(with_smoothing * gain < without);
  }
  // Smoothed, the outliers cost sage1 nothing: its band on plain inputs still holds.
  const ErrorStats e = compare_to_reference(emulate_attention(call, QuantizedKind::sage1_int8, smooth), reference);
  CHECK(e.cosine >= 0.9998);
}

TEST_CASE("quantized emulation: finer INT8 groups are at least as accurate", "[quant]") {
  // Unsmoothed K with outlier channels, where the groups matter. Observed (sage1): rel_l2 per_block
  // 0.03605, per_warp 0.03603, per_thread 0.0338.
  const AttentionCall base = generated(generated_cases()[0]);
  std::vector<double> offsets(64, 0.0);
  for (std::size_t c = 0; c < offsets.size(); c += 8) offsets[c] = 12.0;
  const AttentionCall call = with_key_channel_offsets(base, offsets);
  const ReferenceOutput reference = reference_attention(call);
  auto rel_l2 = [&](QuantGranularity granularity) {
    QuantOptions o;
    o.quant_gran = granularity;
    o.k_smooth = false;
    return compare_to_reference(emulate_attention(call, QuantizedKind::sage1_int8, o), reference).rel_l2;
  };
  const double block = rel_l2(QuantGranularity::per_block), warp = rel_l2(QuantGranularity::per_warp),
               thread = rel_l2(QuantGranularity::per_thread);
  INFO("per_block " << block << ", per_warp " << warp << ", per_thread " << thread);
  CHECK(thread < warp);
  CHECK(warp <= block);
}

TEST_CASE("quantized emulation: the P·V accumulation modes differ in rounding only", "[quant]") {
  // V with one large key (0) that no query attends to much: the per-channel V scale makes every
  // other v8 small, where the modes' rounding differs most.
  AttentionCall call = generated(generated_cases()[0]);
  {
    std::vector<double> v = call.v.to_doubles(), k = call.k.to_doubles();
    const std::int64_t keys = call.v.shape[2], dim = call.v.shape[3];
    for (std::int64_t head = 0; head < call.v.shape[0] * call.v.shape[1]; ++head) {
      for (std::int64_t c = 0; c < dim; ++c) {
        v[static_cast<std::size_t>(head * keys * dim + c)] = 200.0;
        k[static_cast<std::size_t>(head * keys * dim + c)] = 0.0;
      }
    }
    call.v = HostTensor::from_doubles(call.v.dtype, call.v.shape, v);
    call.k = HostTensor::from_doubles(call.k.dtype, call.k.shape, k);
  }
  const ReferenceOutput reference = reference_attention(call);
  auto run = [&](PvAccum accumulation) {
    QuantOptions o;
    o.pv_accum = accumulation;
    return emulate_attention(call, QuantizedKind::sage2_int8_fp8, o);
  };
  // Observed: rel_l2 0.0281277 for fp32 and fp32+fp32 (outputs differ in the last bits); fp32+fp16
  // a little more.
  const HostTensor fp32 = run(PvAccum::fp32), two_fp32 = run(PvAccum::fp32_fp32), fp16 = run(PvAccum::fp32_fp16);
  CHECK(*fp32.bytes != *two_fp32.bytes);
  CHECK(*fp16.bytes != *two_fp32.bytes);
  const ErrorStats e32 = compare_to_reference(fp32, reference), e3232 = compare_to_reference(two_fp32, reference),
                   e3216 = compare_to_reference(fp16, reference);
  INFO("rel_l2 fp32 " << e32.rel_l2 << ", fp32+fp32 " << e3232.rel_l2 << ", fp32+fp16 " << e3216.rel_l2);
  CHECK(e3216.inf_count == 0);
  CHECK_THAT(e32.rel_l2, WithinRel(e3232.rel_l2, 0.01));
  CHECK_THAT(e3216.rel_l2, WithinRel(e3232.rel_l2, 0.25));
  CHECK(e3216.rel_l2 >= e3232.rel_l2);
}

TEST_CASE("quantized emulation: fp32+fp16 stays within fp16 where V scaled to 448 would overflow", "[quant]") {
  // V scaled to 448 would make one key with p = 1 give 448 * 448 = 200704 > 65504. Scaled to 2.25,
  // 32 keys that all have p = 1 give at most 32 * 448 * 2.25 = 32256: finite, and the output is V.
  AttentionCall call;
  call.q = HostTensor::from_doubles(DType::bfloat16, {1, 1, 1, 1}, std::vector<double>{1.0});
  call.k = HostTensor::from_doubles(DType::bfloat16, {1, 1, 64, 1}, std::vector<double>(64, 1.0));
  call.v = HostTensor::from_doubles(DType::bfloat16, {1, 1, 64, 1}, std::vector<double>(64, 3.0));
  QuantOptions o;
  o.pv_accum = PvAccum::fp32_fp16;
  const float out = emulate_attention(call, QuantizedKind::sage2_int8_fp8, o).at(0);
  CHECK(std::isfinite(out));
  CHECK_THAT(out, WithinAbs(3.0, 1e-6));
  // The scale itself: amax maps to 2.25 (exact in e4m3), not to 448.
  HeadMatrix v(2, 1);
  v.values = {3.0f, -1.5f};
  const Fp8PerChannel scaled = quantize_fp8_per_channel(v, kFp16AccumVMax);
  CHECK(scaled.channel_scale[0] == 3.0f / 2.25f);
  CHECK(scaled.values.values[0] == 2.25f);
}

TEST_CASE("quantized emulation: a hand-worked call through every kind", "[quant]") {
  // One query, two keys, d = 1, scale 1: scores in log2 units are log2e * [0, 1], so the weights
  // are [1, e] / (1 + e) and the output is (1 + 3e) / (1 + e) = 2.4621..., before any rounding.
  AttentionCall call;
  call.q = HostTensor::from_doubles(DType::bfloat16, {1, 1, 1, 1}, std::vector<double>{1.0});
  call.k = HostTensor::from_doubles(DType::bfloat16, {1, 1, 2, 1}, std::vector<double>{0.0, 1.0});
  call.v = HostTensor::from_doubles(DType::bfloat16, {1, 1, 2, 1}, std::vector<double>{1.0, 3.0});
  call.scale = 1.0;
  const double exact = (1.0 + 3.0 * std::exp(1.0)) / (1.0 + std::exp(1.0));
  for (QuantizedKind kind : kAllKinds) {
    INFO(to_string(kind));
    CHECK_THAT(emulate_attention(call, kind, QuantOptions{}, {false, false, false}).at(0), WithinAbs(exact, 1e-6));
  }
  // flash: p = [exp2(-log2e), 1] = [0.36788, 1]; P rounded to bf16 (8 significant bits) makes
  // 0.36788 = 188.35 / 512 -> 188 / 512 = 0.3671875, while l keeps the unrounded p.
  const double p0 = std::exp2(-static_cast<double>(kLog2e)), p0_bf16 = 0.3671875;
  CHECK_THAT(emulate_attention(call, QuantizedKind::flash, QuantOptions{}).at(0),
             WithinAbs((p0_bf16 * 1.0 + 3.0) / (1.0 + p0), 1e-6));
  // sage1 after smoothing: K' = [-0.5, 0.5], codes [-127, 127] with s_k = 0.5 / 127; Q scaled by
  // log2e gives code 127 with s_q = log2e / 127. Scores are log2e * [-0.5, 0.5], exactly as before
  // up to the shift.
  CHECK_THAT(emulate_attention(call, QuantizedKind::sage1_int8, QuantOptions{}).at(0),
             WithinAbs((p0_bf16 * 1.0 + 3.0) / (1.0 + p0), 1e-5));
  // sage2: p8 = e4m3(448 * [0.3679, 1]) = [160, 448]; v8 = e4m3(448 * V / 3) = [149.33 -> 144, 448].
  const double sage2 = (160.0 * 144.0 + 448.0 * 448.0) / (1.0 + p0) * (3.0 / 448.0) / 448.0;
  CHECK_THAT(emulate_attention(call, QuantizedKind::sage2_int8_fp8, QuantOptions{}).at(0), WithinAbs(sage2, 1e-5));
  // fa3: p8 = e4m3([0.3679, 1]) = [0.375, 1], v8 as sage2's; Q and K are exact in e4m3.
  const double fa3 = (0.375 * 144.0 + 1.0 * 448.0) / (1.0 + p0) * (3.0 / 448.0);
  CHECK_THAT(emulate_attention(call, QuantizedKind::fa3_fp8, QuantOptions{}).at(0), WithinAbs(fa3, 1e-5));
}

TEST_CASE("quantized emulation: rows that see no key are 0", "[quant]") {
  // Bottom-right with s_q > s_kv: the first s_q - s_kv rows see nothing.
  GeneratedCase c{"", {1, 2, 2, 40, 10, 32, 32}, true, CausalAlignment::bottom_right};
  const AttentionCall call = generated(c);
  const ReferenceOutput reference = reference_attention(call);
  REQUIRE(reference.fully_masked_rows == 2 * 30);
  for (QuantizedKind kind : kAllKinds) {
    INFO(to_string(kind));
    const HostTensor out = emulate_attention(call, kind, QuantOptions{});
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t i = 0; i < 40; ++i) {
        const double first = out.at((h * 40 + i) * 32);
        if (i < 30) CHECK(first == 0.0);
        else CHECK(first != 0.0);
      }
    CHECK(compare_to_reference(out, reference).cosine > 0.99);
  }
}

TEST_CASE("quantized emulation: masks act as they do in the reference", "[quant]") {
  // A padding mask (bool, one per batch, broadcast over heads and queries, as BERT-style models pass
  // it) and an additive float mask with a fully hidden row: each kind stays within its band of the
  // fp64 reference, which applies the same masks, and the hidden row is 0.
  AttentionCall call = generated({"", {2, 4, 4, 150, 150, 64, 64}});
  std::vector<double> keep(2 * 150, 1.0);
  for (int j = 100; j < 150; ++j) keep[150 + j] = 0.0;  // batch 1: its last 50 keys are padding
  call.mask = HostTensor::from_doubles(DType::boolean, {2, 1, 1, 150}, keep);
  const ReferenceOutput padded = reference_attention(call);
  AttentionCall additive = generated({"", {1, 2, 2, 150, 150, 64, 64}});
  std::vector<double> bias(150 * 150);
  for (std::size_t i = 0; i < bias.size(); ++i) bias[i] = -0.01 * static_cast<double>(i % 150);  // a distance bias
  for (int j = 0; j < 150; ++j) bias[7 * 150 + j] = -std::numeric_limits<double>::infinity();  // row 7 sees nothing
  additive.mask = HostTensor::from_doubles(DType::float32, {150, 150}, bias);
  const ReferenceOutput biased = reference_attention(additive);
  REQUIRE(biased.fully_masked_rows == 2);
  const double max_rel_l2[] = {0.003, 0.02, 0.05, 0.07};  // the bands of the unmasked cases
  int slot = 0;
  for (QuantizedKind kind : kAllKinds) {
    INFO(to_string(kind));
    const ErrorStats e = compare_to_reference(output_in_dtype(emulate_attention(call, kind, QuantOptions{}),
                                                              DType::bfloat16), padded);
    CHECK(e.rel_l2 <= max_rel_l2[slot]);
    const HostTensor out = emulate_attention(additive, kind, QuantOptions{});
    CHECK(compare_to_reference(out, biased).rel_l2 <= max_rel_l2[slot]);
    for (std::int64_t h = 0; h < 2; ++h) CHECK(out.at((h * 150 + 7) * 64) == 0.0);
    // Without its mask, the padded call's batch 1 would differ: the mask is really applied.
    AttentionCall unmasked = call;
    unmasked.mask.reset();
    CHECK(compare_to_reference(output_in_dtype(emulate_attention(unmasked, kind, QuantOptions{}), DType::bfloat16),
                               padded).rel_l2 > 0.05);
    ++slot;
  }
}

TEST_CASE("quantized emulation: FA3's per-head scales serve heads of different magnitudes better", "[quant]") {
  AttentionCall call = generated({"", {1, 2, 2, 128, 128, 64, 64}});
  // Head 1's Q, K and V are 2^16 times smaller: scaled by head 0's amax, they fall among e4m3's
  // few subnormals (multiples of 2^-9) or to 0.
  for (HostTensor* t : {&call.q, &call.k, &call.v}) {
    std::vector<double> values = t->to_doubles();
    for (std::size_t i = values.size() / 2; i < values.size(); ++i) values[i] /= 65536.0;
    *t = HostTensor::from_doubles(t->dtype, t->shape, values);
  }
  const ReferenceOutput reference = reference_attention(call);
  // Head 1's error alone: its outputs are too small to show in the whole tensor's.
  auto head1_rel_l2 = [&](Fp8Scale scale) {
    QuantOptions o;
    o.fp8_scale = scale;
    const HostTensor out = emulate_attention(call, QuantizedKind::fa3_fp8, o);
    double error = 0, norm = 0;
    for (std::int64_t i = out.numel() / 2; i < out.numel(); ++i) {
      const double r = reference.values[static_cast<std::size_t>(i)];
      error += (out.at(i) - r) * (out.at(i) - r);
      norm += r * r;
    }
    return std::sqrt(error / norm);
  };
  // Observed: head 1's rel_l2 0.024 per head, 0.25 per tensor.
  const double head_error = head1_rel_l2(Fp8Scale::per_head), tensor_error = head1_rel_l2(Fp8Scale::per_tensor);
  INFO("per_head " << head_error << ", per_tensor " << tensor_error);
  CHECK(head_error * 2 < tensor_error);
}

TEST_CASE("quantized emulation: the result does not depend on the thread count", "[quant]") {
  const AttentionCall call = generated(generated_cases()[1]);
  for (QuantizedKind kind : kAllKinds) {
    const HostTensor one = emulate_attention(call, kind, QuantOptions{}, {}, 1);
    const HostTensor three = emulate_attention(call, kind, QuantOptions{}, {}, 3);
    CHECK(*one.bytes == *three.bytes);
  }
}

TEST_CASE("quantized emulation: GQA's query heads packed as rows where every row sees every key", "[quant]") {
  auto call_of = [](AttentionShape shape, Layout layout = Layout::bhsd, bool causal = false,
                    CausalAlignment alignment = CausalAlignment::bottom_right) {
    GeneratedCallSpec spec;
    spec.shape = shape;
    spec.layout = layout;
    spec.is_causal = causal;
    spec.causal_alignment = alignment;
    spec.seed = 11;
    return generate_call(spec);
  };
  // Decode (one row) in either layout, and a few rows of bhsd: (batch, heads_kv, n_rep * seq_q).
  const std::optional<AttentionShape> decode = packed_query_heads(call_of({2, 8, 2, 1, 300, 64, 64}));
  REQUIRE(decode);
  CHECK(*decode == AttentionShape{2, 2, 2, 4, 300, 64, 64});
  CHECK(packed_query_heads(call_of({2, 8, 2, 1, 300, 64, 64}, Layout::bshd)));
  CHECK(packed_query_heads(call_of({1, 6, 3, 16, 40, 128, 64}))->seq_q == 32);
  // A decode step's causal diagonal hides nothing bottom-right; top-left it hides all but key 0.
  CHECK(packed_query_heads(call_of({1, 8, 2, 1, 300, 64, 64}, Layout::bhsd, true)));
  CHECK_FALSE(packed_query_heads(call_of({1, 8, 2, 1, 300, 64, 64}, Layout::bhsd, true, CausalAlignment::top_left)));
  // Not: without GQA, past 16 rows, bshd rows that interleave heads, rows that see different keys.
  CHECK_FALSE(packed_query_heads(call_of({1, 4, 4, 1, 300, 64, 64})));
  CHECK_FALSE(packed_query_heads(call_of({1, 8, 2, 17, 300, 64, 64})));
  CHECK_FALSE(packed_query_heads(call_of({1, 8, 2, 2, 300, 64, 64}, Layout::bshd)));
  CHECK_FALSE(packed_query_heads(call_of({1, 8, 2, 4, 300, 64, 64}, Layout::bhsd, true)));
  AttentionCall padded = call_of({1, 8, 2, 1, 300, 64, 64});
  std::vector<double> keys(300, 1.0);
  std::fill(keys.begin(), keys.begin() + 20, 0.0);  // left padding: keys 0..19 hidden
  padded.mask = HostTensor::from_doubles(DType::boolean, {1, 1, 1, 300}, keys);
  CHECK_FALSE(packed_query_heads(padded));

  // The definition: a packed call is the call of one head per KV head whose rows are its query
  // heads' rows, head after head; the same bytes in and out, every kind.
  for (const AttentionShape shape : {AttentionShape{2, 8, 2, 1, 300, 64, 64}, AttentionShape{1, 6, 3, 5, 200, 128, 128}}) {
    const AttentionCall gqa = call_of(shape);
    AttentionCall one_head_per_kv = gqa;
    const std::int64_t n_rep = shape.heads_q / shape.heads_kv;
    one_head_per_kv.q.shape = {shape.batch, shape.heads_kv, n_rep * shape.seq_q, shape.head_dim_qk};
    one_head_per_kv.out.reset();
    one_head_per_kv.visibility.reset();
    REQUIRE_FALSE(packed_query_heads(one_head_per_kv));
    for (QuantizedKind kind : kAllKinds) {
      INFO(to_string(kind) << " at " << shape.heads_q << " heads, " << shape.seq_q << " rows");
      const HostTensor packed = emulate_attention(gqa, kind, QuantOptions{});
      const HostTensor by_hand = emulate_attention(one_head_per_kv, kind, QuantOptions{});
      CHECK(packed.shape == std::vector<std::int64_t>{shape.batch, shape.heads_q, shape.seq_q, shape.head_dim_vo});
      CHECK(*packed.bytes == *by_hand.bytes);
      // And within the kind's band of the reference (the test above), as unpacked calls are.
      const ErrorStats e = compare_to_reference(output_in_dtype(packed, DType::bfloat16), reference_attention(gqa));
      CHECK(e.rel_l2 < (kind == QuantizedKind::flash ? 0.003 : kind == QuantizedKind::fa3_fp8 ? 0.07 : 0.05));
    }
    // flash quantizes nothing: packed, its output is that of the query heads run one by one (K and
    // V repeated for each, no GQA, nothing packed), bit for bit.
    AttentionCall unpacked = gqa;
    auto repeated_heads = [&](const HostTensor& kv) {
      const std::vector<double> values = kv.to_doubles();
      const std::int64_t rows = shape.seq_kv * shape.head_dim_qk;
      std::vector<double> out;
      for (std::int64_t b = 0; b < shape.batch; ++b)
        for (std::int64_t h = 0; h < shape.heads_q; ++h) {
          const auto first = values.begin() + (b * shape.heads_kv + h / n_rep) * rows;
          out.insert(out.end(), first, first + rows);
        }
      return HostTensor::from_doubles(kv.dtype, {shape.batch, shape.heads_q, shape.seq_kv, shape.head_dim_qk}, out);
    };
    unpacked.k = repeated_heads(gqa.k);
    unpacked.v = repeated_heads(gqa.v);
    unpacked.out.reset();
    unpacked.visibility.reset();
    REQUIRE_FALSE(packed_query_heads(unpacked));
    CHECK(*emulate_attention(gqa, QuantizedKind::flash, QuantOptions{}).bytes ==
          *emulate_attention(unpacked, QuantizedKind::flash, QuantOptions{}).bytes);
  }
}

TEST_CASE("quantized emulation: a call whose blocks leave the GPU idle splits its keys as the kernels do", "[quant]") {
  // Batch 1, 2 heads of 64 rows, 1000 keys (8 blocks): 2 CTAs, so 4 splits of 2 blocks.
  CHECK(key_split_count(1, 2, 64, 1000, false) == 4);
  CHECK(key_split_count(1, 2, 64, 1000, true) == 1);     // causal: blocks of different lengths
  CHECK(key_split_count(2, 2, 64, 1000, false) == 1);    // batches: not split
  CHECK(key_split_count(1, 200, 64, 1000, false) == 1);  // enough CTAs already
  CHECK(key_split_count(1, 2, 64, 200, false) == 1);     // under two blocks a split
  CHECK(key_split_count(1, 8, 4, 32768, false) == 32);   // a packed decode step: 33 asked, 8 blocks each
  GeneratedCallSpec spec;
  spec.shape = {1, 2, 2, 64, 1000, 64, 64};
  spec.seed = 5;
  const AttentionCall call = generate_call(spec);
  REQUIRE(prepare_attention_inputs(call, QuantizedKind::flash, QuantOptions{}).key_splits == 4);
  const HostTensor split = emulate_attention(call, QuantizedKind::flash, QuantOptions{});

  // By hand: each split's keys a call of their own (not split), weighed by its rows' log2-sum-exp2
  // of the scores (fp64 here, fp32 in the emulation).
  const std::vector<double> q = call.q.to_doubles(), k = call.k.to_doubles(), v = call.v.to_doubles();
  const std::int64_t d = 64, rows = 64, keys = 1000, split_keys = 256;
  std::vector<double> combined(static_cast<std::size_t>(2 * rows * d), 0.0), weights(static_cast<std::size_t>(2 * rows), 0.0);
  std::vector<std::vector<double>> lse_of(4);
  std::vector<HostTensor> outs;
  for (std::int64_t i = 0; i < 4; ++i) {
    const std::int64_t begin = i * split_keys, count = std::min(keys - begin, split_keys);
    std::vector<double> k_part, v_part;
    for (std::int64_t h = 0; h < 2; ++h) {
      const auto first = (h * keys + begin) * d;
      k_part.insert(k_part.end(), k.begin() + first, k.begin() + first + count * d);
      v_part.insert(v_part.end(), v.begin() + first, v.begin() + first + count * d);
    }
    AttentionCall part = call;
    part.k = HostTensor::from_doubles(call.k.dtype, {1, 2, count, d}, k_part);
    part.v = HostTensor::from_doubles(call.v.dtype, {1, 2, count, d}, v_part);
    part.out.reset();
    part.visibility.reset();
    part.scale = call.softmax_scale();
    REQUIRE(prepare_attention_inputs(part, QuantizedKind::flash, QuantOptions{}).key_splits == 1);
    outs.push_back(emulate_attention(part, QuantizedKind::flash, QuantOptions{}));
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t r = 0; r < rows; ++r) {
        double sum = 0.0;
        for (std::int64_t j = 0; j < count; ++j) {
          double dot = 0.0;
          for (std::int64_t c = 0; c < d; ++c) dot += q[(h * rows + r) * d + c] * k_part[(h * count + j) * d + c];
          sum += std::exp(dot * call.softmax_scale());
        }
        lse_of[i].push_back(std::log(sum));
      }
  }
  for (std::int64_t row = 0; row < 2 * rows; ++row) {
    double largest = -1e300;
    for (const auto& lse : lse_of) largest = std::max(largest, lse[row]);
    for (std::int64_t i = 0; i < 4; ++i) {
      const double weight = std::exp(lse_of[i][row] - largest);
      weights[row] += weight;
      const auto* part = reinterpret_cast<const float*>(outs[i].data());
      for (std::int64_t c = 0; c < d; ++c) combined[row * d + c] += weight * part[row * d + c];
    }
  }
  const auto* emulated = reinterpret_cast<const float*>(split.data());
  double worst = 0.0;
  for (std::int64_t row = 0; row < 2 * rows; ++row)
    for (std::int64_t c = 0; c < d; ++c)
      worst = std::max(worst, std::abs(emulated[row * d + c] - combined[row * d + c] / weights[row]));
  CHECK(worst < 1e-5);
  // And as accurate as the call unsplit is, every kind within its band of the reference.
  const ReferenceOutput reference = reference_attention(call);
  for (QuantizedKind kind : kAllKinds) {
    const ErrorStats e = compare_to_reference(output_in_dtype(emulate_attention(call, kind, QuantOptions{}), DType::bfloat16),
                                              reference);
    INFO(to_string(kind) << ": rel_l2 " << e.rel_l2);
    CHECK(e.rel_l2 < (kind == QuantizedKind::flash ? 0.003 : kind == QuantizedKind::fa3_fp8 ? 0.07 : 0.05));
  }
}

// ---- The kernels ----

TEST_CASE("quantized kernels: registered, declining what they cannot run, output as the engine's", "[quant]") {
  const AttentionCall call = generated(generated_cases()[2]);
  const std::pair<const char*, QuantizedKind> kernels[] = {{"flash-cpu", QuantizedKind::flash},
                                                          {"sage1-int8-cpu", QuantizedKind::sage1_int8},
                                                          {"sage2-int8-fp8-cpu", QuantizedKind::sage2_int8_fp8},
                                                          {"fa3-fp8-cpu", QuantizedKind::fa3_fp8}};
  QuantOptions options;
  options.quant_gran = QuantGranularity::per_thread;
  options.pv_accum = PvAccum::fp32;
  options.fp8_scale = Fp8Scale::per_tensor;
  for (const auto& [name, kind] : kernels) {
    INFO(name);
    const Kernel* kernel = KernelRegistry::instance().find(name);
    REQUIRE(kernel);
    CHECK(kernel->description().device == "cpu");
    // --refcheck judges the INT8 and FP8 kinds at their own precision.
    const std::optional<DType> precision = kind == QuantizedKind::flash        ? std::nullopt
                                           : kind == QuantizedKind::sage1_int8 ? std::optional(DType::int8)
                                                                               : std::optional(DType::float8_e4m3fn);
    CHECK(kernel->description().reduced_precision == precision);
    CHECK_FALSE(kernel->unsupported_reason(call));

    AttentionCall fp32 = generated({"", {1, 1, 1, 8, 8, 16, 16}, false, CausalAlignment::top_left, Layout::bhsd,
                                    DType::float32});
    CHECK(kernel->unsupported_reason(fp32) == "needs bfloat16 or float16 inputs, got float32");
    AttentionCall masked = call;
    masked.mask = HostTensor::from_doubles(DType::boolean, {call.shape().seq_kv}, std::vector<double>(300, 1.0));
    CHECK_FALSE(kernel->unsupported_reason(masked));  // the emulations take masks; the CUDA kernels do not
    AttentionCall wide_v = generated({"", {1, 1, 1, 8, 8, 16, 32}});
    CHECK_FALSE(kernel->unsupported_reason(wide_v));  // V's head dim is its own

    // The options travel with the call: the kernel prepares it with the ones it is given.
    auto prepared = kernel->prepare(call, KernelOptions{options});
    // Separate work as on the GPU: quantization, or flash's change of layout from bshd.
    CHECK(prepared->has_preparation() == (kind != QuantizedKind::flash || call.layout == Layout::bshd));
    AttentionCall bshd = generated({"", {1, 2, 2, 8, 8, 16, 16}, false, CausalAlignment::top_left, Layout::bshd});
    CHECK(kernel->prepare(bshd, KernelOptions{options})->has_preparation());
    prepared->run();
    prepared->prepare_inputs();
    prepared->run();
    const HostTensor out = prepared->output();
    CHECK(out.dtype == call.q.dtype);
    CHECK(out.shape == std::vector<std::int64_t>{1, 2, 100, 64});
    CHECK(*out.bytes == *output_in_dtype(emulate_attention(call, kind, options), call.q.dtype).bytes);
  }
}

TEST_CASE("quantized kinds: one table entry gives the GPU kernel and its CPU emulation", "[quant]") {
  for (const QuantizedKindSpec& spec : quantized_kinds()) {
    INFO(spec.name);
    CHECK(to_string(spec.kind) == spec.name);
    const auto* emulation = dynamic_cast<const QuantizedAttentionKernel*>(KernelRegistry::instance().find(spec.name + "-cpu"));
    REQUIRE(emulation);
    CHECK(emulation->kind() == spec.kind);
    CHECK(emulation->description().reduced_precision == spec.reduced_precision);
#ifdef ATTNREPLAY_HAVE_CUDA
    const auto* gpu = dynamic_cast<const QuantizedAttentionKernel*>(KernelRegistry::instance().find(spec.name));
    REQUIRE(gpu);
    CHECK(gpu->kind() == spec.kind);
    CHECK(gpu->description().device == "cuda");
#endif
  }
}
