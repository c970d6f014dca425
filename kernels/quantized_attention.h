#pragma once
// CPU emulation of attnreplay's own attention kernels (flash, sage1-int8, sage2-int8-fp8, fa3-fp8),
// step by step as docs/quantized.md defines them, so that their accuracy can be audited without a
// GPU. Each quantization step is a function of its own, for diagnostics on real inputs (K channel
// means, block amax spread), and the emulation can leave steps out (EmulationStages) to tell which
// one an error comes from.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/attention_call.h"
#include "formats/mask_structure.h"
#include "kernels/quant_options.h"

namespace attnreplay {

// ---- Options (flags of `attnreplay run`, recorded with the results) ----

// QuantOptions and the enums are in kernels/quant_options.h, which the CUDA kernels share.
// The flag spellings: "per_warp", "fp32+fp32", "per_head".
std::string_view to_string(QuantGranularity granularity);
std::string_view to_string(PvAccum accumulation);
std::string_view to_string(Fp8Scale scale);
std::optional<QuantGranularity> parse_quant_granularity(std::string_view text);
std::optional<PvAccum> parse_pv_accum(std::string_view text);
std::optional<Fp8Scale> parse_fp8_scale(std::string_view text);
// The flag values each option accepts, for command-line validation and help.
const std::vector<std::string>& quant_granularity_names();
const std::vector<std::string>& pv_accum_names();
const std::vector<std::string>& fp8_scale_names();
// The inputs the definition takes (bf16/fp16 Q, K, V of one dtype, any head dims; a ragged call
// one sequence at a time): nullopt, or why not. The CUDA kernels add their own limits (dense masks,
// head dims, devices).
std::optional<std::string> quantized_inputs_unsupported_reason(const AttentionCall& call);

// ---- Query heads packed as rows ----

// With GQA and few query rows (a decode step), the query heads that share a KV head run as one head
// whose rows are theirs one after another, head by head (FlashAttention's pack_gqa, FlashInfer's
// decode): a query block then holds n_rep times the rows, and K and V are read once per KV head
// rather than once per query head. Q and the output are the same bytes either way where the call
// is bhsd or has one query row. Applies where every row sees every key (a mask or diagonal would
// differ row by row) and the call has at most this many query rows; the emulation and the CUDA
// kernels pack alike, so the quantization groups of Q (and fa3's Q scale) are the packed head's.
inline constexpr std::int64_t kPackedQueryRowsMax = 16;
// The shape the kernels run the call at, (batch, heads_kv, n_rep * seq_q, ...), where packed.
std::optional<AttentionShape> packed_query_heads(const AttentionCall& call);

// ---- The definition's constants ----

inline constexpr std::int64_t kBlockQ = 64;         // query rows per block
inline constexpr std::int64_t kWarpQ = 16;          // query rows per warp tile
inline constexpr std::int64_t kBlockK = 128;        // keys per block
inline constexpr std::int64_t kFp16ChunkKeys = 32;  // keys summed in fp32 before an fp16 rounding
inline constexpr float kInt8Max = 127.0f;
inline constexpr float kFp8Max = 448.0f;  // largest finite e4m3fn
inline constexpr float kLog2Fp8Max = 8.80735492205760410f;  // log2(448): sage2's P scale, inside exp2
// V's per-channel target under --pv_accum_dtype fp32+fp16: P (<= 448) times V (<= 2.25) summed
// over a 32-key chunk stays within fp16's 65504.
inline constexpr float kFp16AccumVMax = 2.25f;
inline constexpr float kLog2e = 1.4426950408889634f;

// ---- Element conversions (round to nearest even, as the hardware's) ----

float round_to_bfloat16(float value);
float round_to_float16(float value);  // beyond fp16's range: infinity
// bf16 or fp16 as above; float32 (and wider) unchanged.
float round_to_dtype(float value, DType dtype);
// e4m3fn with saturation to +-448 (satfinite); NaN stays NaN.
float round_to_e4m3(float value);
// clamp(rint(value * inverse), -127, 127), rint ties to even; 0 when inverse is 0. The inverse is
// int8_inverse_for(amax): the codes multiply by 127 / amax, as SageAttention's kernels do.
std::int8_t int8_code(float value, float inverse);
// 127 / amax, rounded once; 0 when amax is 0.
float int8_inverse_for(float amax);

// ---- Quantization steps, on one head at a time ----

// One (batch, head) of Q, K or V in fp32, (rows, cols) row-major.
struct HeadMatrix {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::vector<float> values;

  HeadMatrix() = default;
  HeadMatrix(std::int64_t rows, std::int64_t cols)
      : rows(rows), cols(cols), values(static_cast<std::size_t>(rows * cols), 0.0f) {}
  float* row(std::int64_t i) { return values.data() + i * cols; }
  const float* row(std::int64_t i) const { return values.data() + i * cols; }
};

// Head (b, h) of a (batch, heads, seq, dim) tensor of any floating dtype, exactly, in fp32.
HeadMatrix head_as_floats(const HostTensor& bhsd, std::int64_t b, std::int64_t h);

// K smoothing (step 1): each channel's mean over the keys, summed in fp32 block by block (each
// kBlockK keys in key order, then the block sums in block order; 0 when there are no keys), and K
// minus it, kept in fp32.
std::vector<float> channel_means(const HeadMatrix& keys);
void subtract_channel_means(HeadMatrix& keys, std::span<const float> means);

// Which rows share an INT8 scale (step 2). Q and K group differently under per_thread.
enum class Int8Operand { query, key };
std::int64_t int8_group_of_row(QuantGranularity granularity, Int8Operand operand, std::int64_t row);
std::int64_t int8_group_count(QuantGranularity granularity, Int8Operand operand, std::int64_t rows);

struct Int8Matrix {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::vector<std::int8_t> codes;  // (rows, cols)
  std::vector<float> group_amax;   // per group: max |x| over its rows and all channels
  std::vector<float> group_scale;  // per group: amax / 127
  std::vector<float> row_scale;    // per row: its group's scale
};
// INT8 codes of `x` (already multiplied by scale * log2e, for Q) with a scale per group.
Int8Matrix quantize_int8(const HeadMatrix& x, QuantGranularity granularity, Int8Operand operand);

float abs_max(std::span<const float> values);
// The FP8 scale for a given amax: amax / 448 (0 for 0), and what the values are multiplied by:
// target / amax, rounded once (0 for 0).
float fp8_scale_for(float amax);
float fp8_inverse_for(float amax, float target = kFp8Max);
// e4m3(x * inverse) for every element; all 0 when inverse is 0.
HeadMatrix quantize_fp8(const HeadMatrix& x, float inverse);

// Sage2's V: a scale per channel, s_v[c] = max_j |V[j, c]| / 448, and v8 = e4m3(V * (448 / max_j |V[j, c]|)).
struct Fp8PerChannel {
  HeadMatrix values;                // e4m3 values, as fp32
  std::vector<float> channel_scale;  // s_v[c]
};
// `target` is what each channel's amax maps to: 448, or kFp16AccumVMax for fp32+fp16.
Fp8PerChannel quantize_fp8_per_channel(const HeadMatrix& v, float target = kFp8Max);

// ---- The emulation ----

std::string_view to_string(QuantizedKind kind);  // "flash", "sage1-int8", ... (kernels/quantized_kinds.h)

// Which of a kind's reduced-precision steps are applied, to attribute its error. A step left out
// runs in fp32 on the exact inputs. With all three off every kind is the plain flash emulation
// with fp32 P (plus K smoothing for the Sage kinds, which changes nothing beyond fp32 rounding).
struct EmulationStages {
  bool quantize_qk = true;  // INT8 (Sage) or FP8 (fa3) Q and K
  bool quantize_p = true;   // P rounded to the input dtype (flash, sage1) or to e4m3 (sage2, fa3)
  bool quantize_pv = true;  // FP8 V and, for sage2, the --pv_accum_dtype accumulation
};

// One query head as the attention reads it: Q, its INT8 codes (as fp32, exact) or FP8 values.
struct PreparedQueryHead {
  HeadMatrix values;
  std::vector<float> row_scale;  // per row: s_q(i) (Sage with quantize_qk), else empty
  float scale = 1.0f;            // fa3 with quantize_qk: s_q of this head
};

// One kv head: K in 128-key blocks transposed to (block, channel, key) with zero padding, so that
// a block's scores are a product the compiler vectorizes; V by rows.
struct PreparedKeyValueHead {
  std::int64_t keys = 0;
  std::vector<float> keys_by_block;  // (blocks, head_dim_qk, kBlockK)
  std::vector<float> key_scale;      // per key: s_k(j) (Sage with quantize_qk), else empty
  float k_scale = 1.0f;              // fa3 with quantize_qk: s_k of this head
  HeadMatrix values;                 // V, or its e4m3 values
  // Applied to a row's acc / l at the end, per channel: V's dequantization (and 1/448 for sage2's
  // scaled P); empty when there is none.
  std::vector<float> output_factor;
};

// Everything run_emulated_attention() needs: the call after layout change, smoothing and
// quantization (what a kernel's input preparation does).
struct PreparedAttentionInputs {
  QuantizedKind kind = QuantizedKind::flash;
  QuantOptions options;
  EmulationStages stages;
  AttentionShape shape;       // as run: packed_query_heads' where the call's query heads are packed
  AttentionShape call_shape;  // the call's, the output's
  DType input_dtype = DType::bfloat16;
  // Which keys each row sees (formats/mask_structure.h): causality, a window, a mask read as
  // structure. Keys outside a row's range are skipped, as the kernels skip them.
  MaskStructure visible;
  float softmax_scale_log2 = 0.0f;   // scale * log2e
  int key_splits = 1;                // key_split_count's (kernels/quant_options.h), as the kernels split
  std::vector<PreparedQueryHead> queries;      // batch * heads_q
  std::vector<PreparedKeyValueHead> key_values;  // batch * heads_kv
  std::vector<std::vector<float>> k_channel_means;  // batch * heads_kv, when K was smoothed
  // The call's mask where it is no structure, applied score by score (emulations only: the CUDA
  // kernels decline a dense mask).
  std::optional<HostTensor> mask;
};

// threads = 0: one per core.
PreparedAttentionInputs prepare_attention_inputs(const AttentionCall& call, QuantizedKind kind,
                                                 const QuantOptions& options, const EmulationStages& stages = {},
                                                 unsigned threads = 0);
// The output (batch, heads_q, seq_q, head_dim_vo) in float32, before the final rounding to the
// input dtype (output_in_dtype). Rows that see no key are 0.
HostTensor run_emulated_attention(const PreparedAttentionInputs& inputs, unsigned threads = 0);
// Both steps; the result is float32, as run_emulated_attention's.
HostTensor emulate_attention(const AttentionCall& call, QuantizedKind kind, const QuantOptions& options,
                             const EmulationStages& stages = {}, unsigned threads = 0);
// A float32 tensor rounded to `dtype` (bf16 or fp16; others keep float32): a kernel's output.
HostTensor output_in_dtype(const HostTensor& fp32, DType dtype);

}  // namespace attnreplay
