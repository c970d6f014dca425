#include "kernels/quantized_attention.h"
#include "kernels/quantized_kinds.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>

#include "formats/errors.h"
#include "formats/mask_view.h"

namespace attnreplay {

// ---- Options ----

namespace {

template <typename Enum>
struct Spelling {
  Enum value;
  std::string_view name;
};

constexpr Spelling<QuantGranularity> kGranularities[] = {
    {QuantGranularity::per_block, "per_block"},
    {QuantGranularity::per_warp, "per_warp"},
    {QuantGranularity::per_thread, "per_thread"}};
constexpr Spelling<PvAccum> kPvAccums[] = {
    {PvAccum::fp32, "fp32"}, {PvAccum::fp32_fp32, "fp32+fp32"}, {PvAccum::fp32_fp16, "fp32+fp16"}};
constexpr Spelling<Fp8Scale> kFp8Scales[] = {{Fp8Scale::per_tensor, "per_tensor"},
                                             {Fp8Scale::per_head, "per_head"}};

template <typename Enum, std::size_t N>
std::string_view name_of(const Spelling<Enum> (&table)[N], Enum value) {
  for (const auto& entry : table)
    if (entry.value == value) return entry.name;
  return "?";
}

template <typename Enum, std::size_t N>
std::optional<Enum> parse_name(const Spelling<Enum> (&table)[N], std::string_view text) {
  for (const auto& entry : table)
    if (entry.name == text) return entry.value;
  return std::nullopt;
}

template <typename Enum, std::size_t N>
std::vector<std::string> names_of(const Spelling<Enum> (&table)[N]) {
  std::vector<std::string> names;
  for (const auto& entry : table) names.emplace_back(entry.name);
  return names;
}

}  // namespace

std::string_view to_string(QuantGranularity granularity) { return name_of(kGranularities, granularity); }
std::string_view to_string(PvAccum accumulation) { return name_of(kPvAccums, accumulation); }
std::string_view to_string(Fp8Scale scale) { return name_of(kFp8Scales, scale); }
std::optional<QuantGranularity> parse_quant_granularity(std::string_view text) {
  return parse_name(kGranularities, text);
}
std::optional<PvAccum> parse_pv_accum(std::string_view text) { return parse_name(kPvAccums, text); }
std::optional<Fp8Scale> parse_fp8_scale(std::string_view text) { return parse_name(kFp8Scales, text); }

const std::vector<std::string>& quant_granularity_names() {
  static const std::vector<std::string> names = names_of(kGranularities);
  return names;
}
const std::vector<std::string>& pv_accum_names() {
  static const std::vector<std::string> names = names_of(kPvAccums);
  return names;
}
const std::vector<std::string>& fp8_scale_names() {
  static const std::vector<std::string> names = names_of(kFp8Scales);
  return names;
}

// ---- Element conversions ----
// These run once per score (P), so they round with bit operations rather than through
// formats/dtype.h's general converters; the unit tests hold them to those bit for bit.

namespace {

std::uint32_t bits_of(float value) { return std::bit_cast<std::uint32_t>(value); }
float float_of(std::uint32_t bits) { return std::bit_cast<float>(bits); }

// Rounds a finite, non-negative normal `magnitude` to `mantissa_bits` (nearest, ties to even).
float round_mantissa(float magnitude, int mantissa_bits) {
  const int dropped = 23 - mantissa_bits;
  std::uint32_t bits = bits_of(magnitude);
  bits += ((1u << (dropped - 1)) - 1u) + ((bits >> dropped) & 1u);
  return float_of(bits & ~((1u << dropped) - 1u));
}

// Rounds a non-negative `magnitude` (< 2^22 / 2^-quantum_log2) to a multiple of 2^quantum_log2,
// ties to even: adding and removing 1.5 * 2^23 leaves the FPU's own round-to-nearest-even.
float round_to_multiple(float magnitude, int quantum_log2) {
  const float scaled = std::ldexp(magnitude, -quantum_log2);
  const float rounded = (scaled + 0x1.8p23f) - 0x1.8p23f;
  return std::ldexp(rounded, quantum_log2);
}

}  // namespace

float round_to_bfloat16(float value) { return bfloat16_bits_to_float(float_to_bfloat16_bits(value)); }

float round_to_float16(float value) {
  if (std::isnan(value)) return value;
  const float magnitude = std::fabs(value);
  float rounded;
  if (magnitude >= 65520.0f) rounded = std::numeric_limits<float>::infinity();
  else if (magnitude < 0x1p-14f) rounded = round_to_multiple(magnitude, -24);  // subnormal
  else rounded = round_mantissa(magnitude, 10);
  return std::copysign(rounded, value);
}

float round_to_dtype(float value, DType dtype) {
  switch (dtype) {
    case DType::bfloat16: return round_to_bfloat16(value);
    case DType::float16: return round_to_float16(value);
    default: return value;
  }
}

float round_to_e4m3(float value) {
  if (std::isnan(value)) return value;
  const float magnitude = std::fabs(value);
  float rounded;
  if (magnitude >= kFp8Max) rounded = kFp8Max;  // satfinite
  else if (magnitude < 0x1p-6f) rounded = round_to_multiple(magnitude, -9);  // subnormal
  else rounded = round_mantissa(magnitude, 3);  // below 448, so at most 448
  return std::copysign(rounded, value);
}

std::int8_t int8_code(float value, float inverse) {
  if (inverse == 0.0f) return 0;
  const float code = std::nearbyint(value * inverse);
  if (std::isnan(code)) return 0;  // as the GPU's conversion (cvt.rni.s32.f32) gives; casting a NaN is undefined
  return static_cast<std::int8_t>(std::clamp(code, -kInt8Max, kInt8Max));
}

float int8_inverse_for(float amax) { return amax > 0.0f ? kInt8Max / amax : 0.0f; }

// ---- Quantization steps ----

HeadMatrix head_as_floats(const HostTensor& bhsd, std::int64_t b, std::int64_t h) {
  const std::int64_t heads = bhsd.shape[1], seq = bhsd.shape[2], dim = bhsd.shape[3];
  HeadMatrix out(seq, dim);
  const std::size_t size = dtype_size(bhsd.dtype);
  const std::byte* base = bhsd.data() + static_cast<std::size_t>((b * heads + h) * seq * dim) * size;
  const std::size_t count = out.values.size();
  if (bhsd.dtype == DType::bfloat16 || bhsd.dtype == DType::float16) {
    std::vector<std::uint16_t> bits(count);
    std::memcpy(bits.data(), base, count * size);
    const bool bf16 = bhsd.dtype == DType::bfloat16;
    for (std::size_t i = 0; i < count; ++i)
      out.values[i] = bf16 ? bfloat16_bits_to_float(bits[i]) : float16_bits_to_float(bits[i]);
  } else {
    for (std::size_t i = 0; i < count; ++i)
      out.values[i] = static_cast<float>(element_to_double(bhsd.dtype, base + i * size));
  }
  return out;
}

std::vector<float> channel_means(const HeadMatrix& keys) {
  // Block by block, so that the GPU sums blocks in parallel and only the block sums in order.
  std::vector<float> sums(static_cast<std::size_t>(keys.cols), 0.0f);
  if (keys.rows == 0) return sums;
  std::vector<float> block_sums(static_cast<std::size_t>(keys.cols));
  for (std::int64_t first = 0; first < keys.rows; first += kBlockK) {
    std::fill(block_sums.begin(), block_sums.end(), 0.0f);
    for (std::int64_t j = first; j < std::min(keys.rows, first + kBlockK); ++j) {
      const float* key = keys.row(j);
      for (std::int64_t c = 0; c < keys.cols; ++c) block_sums[c] += key[c];
    }
    for (std::int64_t c = 0; c < keys.cols; ++c) sums[c] += block_sums[c];
  }
  const auto count = static_cast<float>(keys.rows);
  for (float& sum : sums) sum /= count;
  return sums;
}

void subtract_channel_means(HeadMatrix& keys, std::span<const float> means) {
  ATTNREPLAY_ASSERT(static_cast<std::int64_t>(means.size()) == keys.cols, "one mean per channel");
  for (std::int64_t j = 0; j < keys.rows; ++j) {
    float* key = keys.row(j);
    for (std::int64_t c = 0; c < keys.cols; ++c) key[c] -= means[c];
  }
}

std::int64_t int8_group_of_row(QuantGranularity granularity, Int8Operand operand, std::int64_t row) {
  if (operand == Int8Operand::key) {
    // Keys with equal index mod 8 sit in the same thread's fragment columns.
    if (granularity == QuantGranularity::per_thread) return (row / kBlockK) * 8 + row % 8;
    return row / kBlockK;
  }
  switch (granularity) {
    case QuantGranularity::per_block: return row / kBlockQ;
    case QuantGranularity::per_warp: return row / kWarpQ;
    case QuantGranularity::per_thread: return (row / kWarpQ) * 8 + (row % kWarpQ) % 8;  // rows r and r + 8
  }
  return 0;
}

std::int64_t int8_group_count(QuantGranularity granularity, Int8Operand operand, std::int64_t rows) {
  if (rows <= 0) return 0;
  const std::int64_t block = operand == Int8Operand::key                ? kBlockK
                             : granularity == QuantGranularity::per_block ? kBlockQ
                                                                          : kWarpQ;
  const std::int64_t blocks = (rows + block - 1) / block;
  // Per thread, a partial last block still numbers its groups from 0 to 7 (some may be empty).
  return granularity == QuantGranularity::per_thread ? blocks * 8 : blocks;
}

Int8Matrix quantize_int8(const HeadMatrix& x, QuantGranularity granularity, Int8Operand operand) {
  Int8Matrix out;
  out.rows = x.rows;
  out.cols = x.cols;
  const std::int64_t groups = int8_group_count(granularity, operand, x.rows);
  out.group_amax.assign(static_cast<std::size_t>(groups), 0.0f);
  for (std::int64_t i = 0; i < x.rows; ++i) {
    float& amax = out.group_amax[static_cast<std::size_t>(int8_group_of_row(granularity, operand, i))];
    amax = std::max(amax, abs_max({x.row(i), static_cast<std::size_t>(x.cols)}));
  }
  out.group_scale.resize(out.group_amax.size());
  for (std::size_t g = 0; g < out.group_amax.size(); ++g) out.group_scale[g] = out.group_amax[g] / kInt8Max;
  out.codes.resize(x.values.size());
  out.row_scale.resize(static_cast<std::size_t>(x.rows));
  for (std::int64_t i = 0; i < x.rows; ++i) {
    const auto group = static_cast<std::size_t>(int8_group_of_row(granularity, operand, i));
    out.row_scale[static_cast<std::size_t>(i)] = out.group_scale[group];
    const float inverse = int8_inverse_for(out.group_amax[group]);
    const float* row = x.row(i);
    std::int8_t* codes = out.codes.data() + i * x.cols;
    for (std::int64_t c = 0; c < x.cols; ++c) codes[c] = int8_code(row[c], inverse);
  }
  return out;
}

float abs_max(std::span<const float> values) {
  float amax = 0.0f;
  for (float value : values) amax = std::max(amax, std::fabs(value));
  return amax;
}

float fp8_scale_for(float amax) { return amax / kFp8Max; }

float fp8_inverse_for(float amax, float target) { return amax > 0.0f ? target / amax : 0.0f; }

HeadMatrix quantize_fp8(const HeadMatrix& x, float inverse) {
  HeadMatrix out(x.rows, x.cols);
  if (inverse == 0.0f) return out;
  for (std::size_t i = 0; i < x.values.size(); ++i) out.values[i] = round_to_e4m3(x.values[i] * inverse);
  return out;
}

Fp8PerChannel quantize_fp8_per_channel(const HeadMatrix& v, float target) {
  Fp8PerChannel out;
  out.values = HeadMatrix(v.rows, v.cols);
  std::vector<float> amax(static_cast<std::size_t>(v.cols), 0.0f);
  for (std::int64_t j = 0; j < v.rows; ++j)
    for (std::int64_t c = 0; c < v.cols; ++c) amax[c] = std::max(amax[c], std::fabs(v.row(j)[c]));
  out.channel_scale.resize(amax.size());
  std::vector<float> inverse(amax.size());
  for (std::size_t c = 0; c < amax.size(); ++c) {
    out.channel_scale[c] = amax[c] / target;
    inverse[c] = fp8_inverse_for(amax[c], target);
  }
  for (std::int64_t j = 0; j < v.rows; ++j)
    for (std::int64_t c = 0; c < v.cols; ++c) {
      out.values.row(j)[c] = inverse[c] == 0.0f ? 0.0f : round_to_e4m3(v.row(j)[c] * inverse[c]);
    }
  return out;
}

std::optional<std::string> quantized_inputs_unsupported_reason(const AttentionCall& call) {
  const DType dtype = call.q.dtype;
  if (dtype != DType::bfloat16 && dtype != DType::float16) {
    return fmt::format("needs bfloat16 or float16 inputs, got {}", dtype_name(dtype));
  }
  if (call.k.dtype != dtype || call.v.dtype != dtype) {
    return fmt::format("needs Q, K and V of one dtype, got {}, {}, {}", dtype_name(dtype), dtype_name(call.k.dtype),
                       dtype_name(call.v.dtype));
  }
  return std::nullopt;
}

std::optional<AttentionShape> packed_query_heads(const AttentionCall& call) {
  const AttentionShape s = call.shape();
  if (s.heads_kv <= 0 || s.heads_q <= s.heads_kv || s.heads_q % s.heads_kv != 0) return std::nullopt;
  if (s.seq_q > kPackedQueryRowsMax) return std::nullopt;
  // bshd rows of several queries interleave the heads: not one run of rows per KV head.
  if (call.layout != Layout::bhsd && s.seq_q != 1) return std::nullopt;
  const std::shared_ptr<const CallVisibility> visibility = visibility_of(call);
  if (visibility->dense_mask || !visibility->structure.every_row_sees_every_key()) return std::nullopt;
  AttentionShape packed = s;
  packed.seq_q = s.seq_q * (s.heads_q / s.heads_kv);
  packed.heads_q = s.heads_kv;
  return packed;
}

// ---- The emulation ----

std::string_view to_string(QuantizedKind kind) { return quantized_kind(kind).name; }

namespace {

bool is_sage(QuantizedKind kind) { return kind == QuantizedKind::sage1_int8 || kind == QuantizedKind::sage2_int8_fp8; }

unsigned thread_count(unsigned threads) {
  return threads != 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
}

// Runs body(item) for item in [0, count) on up to `threads` threads; rethrows the first exception.
void parallel_for(std::int64_t count, unsigned threads, const std::function<void(std::int64_t)>& body) {
  const auto workers = static_cast<std::int64_t>(std::min<std::int64_t>(thread_count(threads), count));
  std::atomic<std::int64_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto worker = [&] {
    try {
      for (std::int64_t item = next++; item < count; item = next++) body(item);
    } catch (...) {
      std::lock_guard lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      next = count;
    }
  };
  {
    std::vector<std::jthread> pool;
    for (std::int64_t t = 1; t < workers; ++t) pool.emplace_back(worker);
    if (workers > 0) worker();
  }
  if (failure) std::rethrow_exception(failure);
}

// K in (block, channel, key) order with the keys of a partial last block zero.
std::vector<float> keys_by_block(const HeadMatrix& keys) {
  const std::int64_t blocks = (keys.rows + kBlockK - 1) / kBlockK;
  std::vector<float> out(static_cast<std::size_t>(blocks * keys.cols * kBlockK), 0.0f);
  for (std::int64_t j = 0; j < keys.rows; ++j) {
    float* block = out.data() + (j / kBlockK) * keys.cols * kBlockK;
    for (std::int64_t c = 0; c < keys.cols; ++c) block[c * kBlockK + j % kBlockK] = keys.row(j)[c];
  }
  return out;
}

HeadMatrix int8_codes_as_floats(const Int8Matrix& q) {
  HeadMatrix out(q.rows, q.cols);
  for (std::size_t i = 0; i < q.codes.size(); ++i) out.values[i] = q.codes[i];
  return out;
}

float largest_head_amax(const std::vector<HeadMatrix>& heads) {
  float amax = 0.0f;
  for (const HeadMatrix& head : heads) amax = std::max(amax, abs_max(head.values));
  return amax;
}

}  // namespace

PreparedAttentionInputs prepare_attention_inputs(const AttentionCall& call, QuantizedKind kind,
                                                 const QuantOptions& options, const EmulationStages& stages,
                                                 unsigned threads) {
  PreparedAttentionInputs in;
  in.kind = kind;
  in.options = options;
  in.stages = stages;
  in.call_shape = call.shape();
  const std::optional<AttentionShape> packed = packed_query_heads(call);
  in.shape = packed.value_or(in.call_shape);
  const AttentionShape& s = in.shape;
  in.input_dtype = call.q.dtype;
  const std::shared_ptr<const CallVisibility> visibility = visibility_of(call);
  in.visible = packed ? MaskStructure::all_visible(s) : visibility->structure;
  if (visibility->dense_mask) in.mask = call.mask;
  // Split where the CUDA kernels split: calls they take (every row sees every key, no diagonal).
  const bool undivided = !in.mask && !in.visible.upper && in.visible.every_row_sees_every_key();
  in.key_splits = undivided ? key_split_count(s.batch, s.heads_q, s.seq_q, s.seq_kv, false) : 1;
  in.softmax_scale_log2 = static_cast<float>(call.softmax_scale()) * kLog2e;

  HostTensor q = to_bhsd(call.q, call.layout);
  if (packed) q.shape = {s.batch, s.heads_q, s.seq_q, s.head_dim_qk};  // the same bytes, rows per KV head
  const HostTensor k = to_bhsd(call.k, call.layout);
  const HostTensor v = to_bhsd(call.v, call.layout);
  const std::int64_t q_heads = s.batch * s.heads_q, kv_heads = s.batch * s.heads_kv;
  std::vector<HeadMatrix> q_raw(static_cast<std::size_t>(q_heads));
  std::vector<HeadMatrix> k_raw(static_cast<std::size_t>(kv_heads)), v_raw(static_cast<std::size_t>(kv_heads));
  parallel_for(q_heads + kv_heads, threads, [&](std::int64_t item) {
    if (item < q_heads) {
      q_raw[item] = head_as_floats(q, item / s.heads_q, item % s.heads_q);
    } else {
      const std::int64_t head = item - q_heads;
      k_raw[head] = head_as_floats(k, head / s.heads_kv, head % s.heads_kv);
      v_raw[head] = head_as_floats(v, head / s.heads_kv, head % s.heads_kv);
    }
  });

  const bool sage = is_sage(kind);
  const bool fa3 = kind == QuantizedKind::fa3_fp8;
  // FA3's maxima: one per (batch, head), or the largest over the tensor for all of them.
  auto fa3_amax = [&](const std::vector<HeadMatrix>& heads) {
    std::vector<float> amax(heads.size());
    const float tensor_amax = largest_head_amax(heads);
    for (std::size_t i = 0; i < heads.size(); ++i)
      amax[i] = options.fp8_scale == Fp8Scale::per_tensor ? tensor_amax : abs_max(heads[i].values);
    return amax;
  };
  std::vector<float> q_amax, k_amax, v_amax;
  if (fa3 && stages.quantize_qk) q_amax = fa3_amax(q_raw), k_amax = fa3_amax(k_raw);
  if (fa3 && stages.quantize_pv) v_amax = fa3_amax(v_raw);

  in.queries.resize(q_raw.size());
  in.key_values.resize(k_raw.size());
  if (sage && options.k_smooth) in.k_channel_means.resize(k_raw.size());
  parallel_for(q_heads + kv_heads, threads, [&](std::int64_t item) {
    if (item < q_heads) {
      PreparedQueryHead& out = in.queries[item];
      HeadMatrix& raw = q_raw[item];
      if (sage && stages.quantize_qk) {
        // Scores come out in the log2 domain, ready for exp2.
        for (float& value : raw.values) value *= in.softmax_scale_log2;
        Int8Matrix codes = quantize_int8(raw, options.quant_gran, Int8Operand::query);
        out.values = int8_codes_as_floats(codes);
        out.row_scale = std::move(codes.row_scale);
      } else if (fa3 && stages.quantize_qk) {
        out.scale = fp8_scale_for(q_amax[item]);
        out.values = quantize_fp8(raw, fp8_inverse_for(q_amax[item]));
      } else {
        out.values = std::move(raw);
      }
      return;
    }
    const std::int64_t head = item - q_heads;
    PreparedKeyValueHead& out = in.key_values[head];
    HeadMatrix& keys = k_raw[head];
    HeadMatrix& values = v_raw[head];
    out.keys = keys.rows;
    if (sage && options.k_smooth) {
      in.k_channel_means[head] = channel_means(keys);
      subtract_channel_means(keys, in.k_channel_means[head]);
    }
    if (sage && stages.quantize_qk) {
      Int8Matrix codes = quantize_int8(keys, options.quant_gran, Int8Operand::key);
      out.keys_by_block = keys_by_block(int8_codes_as_floats(codes));
      out.key_scale = std::move(codes.row_scale);
    } else if (fa3 && stages.quantize_qk) {
      out.k_scale = fp8_scale_for(k_amax[head]);
      out.keys_by_block = keys_by_block(quantize_fp8(keys, fp8_inverse_for(k_amax[head])));
    } else {
      out.keys_by_block = keys_by_block(keys);
    }
    const bool sage2 = kind == QuantizedKind::sage2_int8_fp8;
    if (sage2 && stages.quantize_pv) {
      Fp8PerChannel v8 = quantize_fp8_per_channel(
          values, options.pv_accum == PvAccum::fp32_fp16 ? kFp16AccumVMax : kFp8Max);
      out.values = std::move(v8.values);
      out.output_factor = std::move(v8.channel_scale);
    } else if (fa3 && stages.quantize_pv) {
      out.values = quantize_fp8(values, fp8_inverse_for(v_amax[head]));
      out.output_factor.assign(static_cast<std::size_t>(values.cols), fp8_scale_for(v_amax[head]));
    } else {
      out.values = std::move(values);
    }
  });
  return in;
}

namespace {

// How a block's P·V reaches the row's accumulator.
enum class PvPath { block_fp32, straight_fp32, block_fp16 };

// Per-thread working memory for one query block: each row's running max, sum and accumulator.
struct RowBlockState {
  std::vector<float> m, l, acc;  // acc: (rows, head_dim_vo)
  std::vector<float> split_rows, split_lse;  // key splits: (splits, rows, head_dim_vo), (splits, rows)
  std::vector<float> dots, factors, scores, p_used, block_acc, chunk_acc, mask_terms;
  std::vector<std::pair<std::int64_t, std::int64_t>> key_ranges;  // per row: the keys it sees
};

// Scores of one query row against one 128-key block: out[j] = sum_c q[c] * keys[c][j]. The
// channel loop is outside so that the key loop vectorizes. `Sum` is float, or double where INT8
// codes could make an fp32 sum inexact.
template <typename Sum>
void block_dots(const float* q, const float* keys, std::int64_t dim, float* out) {
  Sum sums[kBlockK] = {};
  for (std::int64_t c = 0; c < dim; ++c) {
    const Sum qc = q[c];
    const float* key_channel = keys + c * kBlockK;
    for (std::int64_t j = 0; j < kBlockK; ++j) sums[j] += qc * static_cast<Sum>(key_channel[j]);
  }
  for (std::int64_t j = 0; j < kBlockK; ++j) out[j] = static_cast<float>(sums[j]);
}

class HeadAttention {
 public:
  HeadAttention(const PreparedAttentionInputs& in, std::int64_t b, std::int64_t h)
      : in_(in), s_(in.shape), b_(b), h_(h), mask_(in.mask, in.shape), query_(in.queries[static_cast<std::size_t>(b * s_.heads_q + h)]),
        kv_(in.key_values[static_cast<std::size_t>(b * s_.heads_kv + h / (s_.heads_q / s_.heads_kv))]) {
    const bool sage = is_sage(in.kind);
    per_key_scales_ = sage && in.stages.quantize_qk;
    // INT8 products are exact in fp32 while |sum| < 2^24, i.e. head_dim * 127^2 < 2^24.
    exact_in_float_ = !per_key_scales_ || s_.head_dim_qk * 127 * 127 < (1 << 24);
    if (in.kind == QuantizedKind::fa3_fp8 && in.stages.quantize_qk) {
      score_factor_ = query_.scale * kv_.k_scale * in.softmax_scale_log2;
    } else if (!per_key_scales_) {
      score_factor_ = in.softmax_scale_log2;
    }
    // As the CUDA kernels accumulate: 16-bit P·V straight into acc; FP8 P·V a block at a time
    // (fa3), or as sage2's --pv_accum_dtype says.
    const bool sage2_pv = in.kind == QuantizedKind::sage2_int8_fp8 && in.stages.quantize_pv;
    const bool fa3_pv = in.kind == QuantizedKind::fa3_fp8 && in.stages.quantize_pv;
    // sage2 scales P by 448 into e4m3's range inside exp2, and l with it.
    if (in.kind == QuantizedKind::sage2_int8_fp8 && in.stages.quantize_p) log2_p_scale_ = kLog2Fp8Max;
    path_ = fa3_pv                                   ? PvPath::block_fp32
            : !sage2_pv                              ? PvPath::straight_fp32
            : in.options.pv_accum == PvAccum::fp32      ? PvPath::straight_fp32
            : in.options.pv_accum == PvAccum::fp32_fp16 ? PvPath::block_fp16
                                                        : PvPath::block_fp32;
  }

  // Rows [row_begin, row_end) of this head into `out` ((seq_q, head_dim_vo) of this head).
  void rows(std::int64_t row_begin, std::int64_t row_end, float* out, RowBlockState& st) const {
    const std::int64_t n_rows = row_end - row_begin, dv = s_.head_dim_vo;
    st.m.assign(static_cast<std::size_t>(n_rows), -std::numeric_limits<float>::infinity());
    st.l.assign(static_cast<std::size_t>(n_rows), 0.0f);
    st.acc.assign(static_cast<std::size_t>(n_rows * dv), 0.0f);
    st.dots.resize(kBlockK), st.factors.resize(kBlockK), st.scores.resize(kBlockK), st.p_used.resize(kBlockK);
    st.mask_terms.resize(kBlockK);
    st.block_acc.resize(static_cast<std::size_t>(dv)), st.chunk_acc.resize(static_cast<std::size_t>(dv));
    st.key_ranges.resize(static_cast<std::size_t>(n_rows));
    std::int64_t first_key = s_.seq_kv, last_end = 0;
    for (std::int64_t r = 0; r < n_rows; ++r) {
      const auto range = in_.visible.row_keys(b_, h_, row_begin + r);
      st.key_ranges[r] = range;
      if (range.first < range.second) first_key = std::min(first_key, range.first), last_end = std::max(last_end, range.second);
    }
    if (in_.key_splits <= 1) {
      attend(row_begin, n_rows, first_key, last_end, st);
      normalized_rows(n_rows, out + row_begin * dv, st);
      return;
    }
    // Key splits (docs/quantized.md): each split's blocks from a fresh m, l and acc, its rows
    // normalized and its m + log2 l kept; then each row the splits' rows weighted by exp2 of their
    // m + log2 l less the largest, over the weights' sum, as combine_key_splits adds them.
    const std::int64_t split_keys = key_split_keys(s_.seq_kv, in_.key_splits);
    const std::int64_t splits = in_.key_splits;
    st.split_rows.assign(static_cast<std::size_t>(splits * n_rows * dv), 0.0f);
    st.split_lse.assign(static_cast<std::size_t>(splits * n_rows), -std::numeric_limits<float>::infinity());
    for (std::int64_t split = 0; split < splits; ++split) {
      const std::int64_t begin = split * split_keys;
      st.m.assign(static_cast<std::size_t>(n_rows), -std::numeric_limits<float>::infinity());
      st.l.assign(static_cast<std::size_t>(n_rows), 0.0f);
      st.acc.assign(static_cast<std::size_t>(n_rows * dv), 0.0f);
      attend(row_begin, n_rows, std::max(first_key, begin), std::min(last_end, begin + split_keys), st);
      normalized_rows(n_rows, st.split_rows.data() + split * n_rows * dv, st);
      for (std::int64_t r = 0; r < n_rows; ++r)
        if (st.l[r] != 0.0f) st.split_lse[split * n_rows + r] = st.m[r] + std::log2(st.l[r]);
    }
    for (std::int64_t r = 0; r < n_rows; ++r) {
      float largest = -std::numeric_limits<float>::infinity();
      for (std::int64_t split = 0; split < splits; ++split) largest = std::max(largest, st.split_lse[split * n_rows + r]);
      float* o = out + (row_begin + r) * dv;
      for (std::int64_t c = 0; c < dv; ++c) {
        float weights = 0.0f, sum = 0.0f;
        if (largest != -std::numeric_limits<float>::infinity()) {
          for (std::int64_t split = 0; split < splits; ++split) {
            const float weight = std::exp2(st.split_lse[split * n_rows + r] - largest);
            weights += weight;
            sum += weight * st.split_rows[(split * n_rows + r) * dv + c];
          }
        }
        o[c] = weights > 0.0f ? sum / weights : 0.0f;
      }
    }
  }

 private:
  // The blocks of keys [key_begin, key_end) that rows [row_begin, row_begin + n_rows) see, into
  // st.m, st.l and st.acc. Key blocks outside, rows inside, so that a block's keys stay in cache;
  // each row still sees its blocks in key order. Blocks start at multiples of kBlockK, as the
  // kernels' do.
  void attend(std::int64_t row_begin, std::int64_t n_rows, std::int64_t key_begin, std::int64_t key_end,
              RowBlockState& st) const {
    const std::int64_t dv = s_.head_dim_vo;
    for (std::int64_t block_start = key_begin / kBlockK * kBlockK; block_start < key_end; block_start += kBlockK) {
      const float* keys = kv_.keys_by_block.data() + (block_start / kBlockK) * s_.head_dim_qk * kBlockK;
      for (std::int64_t r = 0; r < n_rows; ++r) {
        const auto [first, end] = st.key_ranges[r];
        const std::int64_t hidden_before = std::max<std::int64_t>(first - block_start, 0);
        const std::int64_t visible = std::min(end, block_start + kBlockK) - block_start;
        if (visible <= hidden_before) continue;  // a block with every key hidden changes nothing
        block(row_begin + r, block_start, hidden_before, visible, keys, st.m[r], st.l[r], st.acc.data() + r * dv, st);
      }
    }
  }

  // acc / l (times V's dequantization) of each row into `out` ((n_rows, head_dim_vo)).
  void normalized_rows(std::int64_t n_rows, float* out, const RowBlockState& st) const {
    const std::int64_t dv = s_.head_dim_vo;
    for (std::int64_t r = 0; r < n_rows; ++r) {
      float* o = out + r * dv;
      const float* acc = st.acc.data() + r * dv;
      // One reciprocal per row, as the kernels compute it; no visible key (l = 0): 0, as torch's
      // math backend gives.
      const float inverse_l = st.l[r] == 0.0f ? 0.0f : 1.0f / st.l[r];
      for (std::int64_t c = 0; c < dv; ++c)
        o[c] = kv_.output_factor.empty() ? acc[c] * inverse_l : (acc[c] * inverse_l) * kv_.output_factor[c];
    }
  }

  float p_rounded(float p) const {
    if (!in_.stages.quantize_p) return p;
    switch (in_.kind) {
      case QuantizedKind::flash:
      case QuantizedKind::sage1_int8: return round_to_dtype(p, in_.input_dtype);
      case QuantizedKind::sage2_int8_fp8:  // p is scaled by 448 already (log2_p_scale_)
      case QuantizedKind::fa3_fp8: return round_to_e4m3(p);
    }
    return p;
  }

  // Keys [hidden_before, visible) of the block starting at block_start are row i's; those before
  // are hidden (p = 0), as a kernel masks the start of a row's first block.
  void block(std::int64_t i, std::int64_t block_start, std::int64_t hidden_before, std::int64_t visible,
             const float* keys, float& m, float& l, float* acc, RowBlockState& st) const {
    const std::int64_t dv = s_.head_dim_vo;
    const float* q = query_.values.row(i);
    if (exact_in_float_) block_dots<float>(q, keys, s_.head_dim_qk, st.dots.data());
    else block_dots<double>(q, keys, s_.head_dim_qk, st.dots.data());
    float block_max = -std::numeric_limits<float>::infinity();
    // A mask's term is added to the score in the log2 domain (times log2e); a bool mask hides keys.
    if (mask_) mask_.row(b_, h_, i, block_start, visible, st.mask_terms.data());
    for (std::int64_t j = hidden_before; j < visible; ++j) {
      const float factor = per_key_scales_ ? query_.row_scale[static_cast<std::size_t>(i)] *
                                                 kv_.key_scale[static_cast<std::size_t>(block_start + j)]
                                           : score_factor_;
      float score = st.dots[j] * factor;
      if (mask_) score += st.mask_terms[j] * kLog2e;
      st.factors[j] = factor;
      st.scores[j] = score;
      block_max = std::max(block_max, score);
    }
    const float m_new = std::max(m, block_max);
    const float alpha = m_new == -std::numeric_limits<float>::infinity() ? 1.0f : std::exp2(m - m_new);
    // Unmasked, the dot product is scaled and m subtracted in one fma, as the kernels do.
    const float offset = log2_p_scale_ - m_new;
    float row_sum = 0.0f;
    std::fill(st.p_used.begin(), st.p_used.begin() + hidden_before, 0.0f);
    for (std::int64_t j = hidden_before; j < visible; ++j) {
      const float p = m_new == -std::numeric_limits<float>::infinity() ? 0.0f
                      : mask_ ? std::exp2(st.scores[j] + offset)
                              : std::exp2(std::fma(st.dots[j], st.factors[j], offset));
      row_sum += p;
      st.p_used[j] = p_rounded(p);
    }
    l = l * alpha + row_sum;
    m = m_new;

    const float* v = kv_.values.row(block_start);
    // Σ p_j · V[j, :] over keys [first, last) of the block, added to `sum` in key order, in fp32.
    auto add_products = [&](float* sum, std::int64_t first, std::int64_t last) {
      for (std::int64_t j = first; j < last; ++j) {
        const float p = st.p_used[j];
        const float* v_row = v + j * dv;
        for (std::int64_t c = 0; c < dv; ++c) sum[c] += p * v_row[c];
      }
    };
    if (path_ == PvPath::block_fp32) {
      std::fill(st.block_acc.begin(), st.block_acc.end(), 0.0f);
      add_products(st.block_acc.data(), 0, visible);
      for (std::int64_t c = 0; c < dv; ++c) acc[c] = acc[c] * alpha + st.block_acc[c];
      return;
    }
    for (std::int64_t c = 0; c < dv; ++c) acc[c] *= alpha;
    if (path_ == PvPath::straight_fp32) {
      add_products(acc, 0, visible);
      return;
    }
    // A fresh fp16 accumulator per 32-key chunk (one k32 MMA): the chunk summed in fp32, rounded
    // to fp16, then added to acc in fp32.
    for (std::int64_t chunk_start = 0; chunk_start < visible; chunk_start += kFp16ChunkKeys) {
      std::fill(st.chunk_acc.begin(), st.chunk_acc.end(), 0.0f);
      add_products(st.chunk_acc.data(), chunk_start, std::min(visible, chunk_start + kFp16ChunkKeys));
      for (std::int64_t c = 0; c < dv; ++c) acc[c] += round_to_float16(st.chunk_acc[c]);
    }
  }

  const PreparedAttentionInputs& in_;
  const AttentionShape& s_;
  std::int64_t b_ = 0, h_ = 0;
  MaskView mask_;
  const PreparedQueryHead& query_;
  const PreparedKeyValueHead& kv_;
  bool per_key_scales_ = false;
  bool exact_in_float_ = true;
  float score_factor_ = 1.0f;
  float log2_p_scale_ = 0.0f;
  PvPath path_ = PvPath::block_fp32;
};

}  // namespace

HostTensor run_emulated_attention(const PreparedAttentionInputs& in, unsigned threads) {
  const AttentionShape& s = in.shape;
  // The call's shape: packed query heads' rows are its heads' rows, in order.
  const AttentionShape& c = in.call_shape;
  HostTensor out = HostTensor::allocate(DType::float32, {c.batch, c.heads_q, c.seq_q, c.head_dim_vo});
  auto* values = reinterpret_cast<float*>(out.mutable_data());
  // Work items are (batch, head, 64-row query block), so that one long head still spreads over
  // every core.
  const std::int64_t q_blocks = (s.seq_q + kBlockQ - 1) / kBlockQ;
  const std::int64_t items = s.batch * s.heads_q * q_blocks;
  parallel_for(items, threads, [&](std::int64_t item) {
    thread_local RowBlockState state;
    const std::int64_t head = item / q_blocks, q_block = item % q_blocks;
    const HeadAttention attention(in, head / s.heads_q, head % s.heads_q);
    attention.rows(q_block * kBlockQ, std::min(s.seq_q, (q_block + 1) * kBlockQ),
                   values + head * s.seq_q * s.head_dim_vo, state);
  });
  return out;
}

HostTensor emulate_attention(const AttentionCall& call, QuantizedKind kind, const QuantOptions& options,
                             const EmulationStages& stages, unsigned threads) {
  return run_emulated_attention(prepare_attention_inputs(call, kind, options, stages, threads), threads);
}

HostTensor output_in_dtype(const HostTensor& fp32, DType dtype) {
  ATTNREPLAY_ASSERT(fp32.dtype == DType::float32, "emulated output is float32");
  if (dtype != DType::bfloat16 && dtype != DType::float16) return fp32;
  HostTensor out = HostTensor::allocate(dtype, fp32.shape);
  const auto* in = reinterpret_cast<const float*>(fp32.data());
  auto* bits = reinterpret_cast<std::uint16_t*>(out.mutable_data());
  const std::int64_t count = fp32.numel();
  for (std::int64_t i = 0; i < count; ++i)
    bits[i] = dtype == DType::bfloat16 ? float_to_bfloat16_bits(in[i]) : float_to_float16_bits(in[i]);
  return out;
}

}  // namespace attnreplay
