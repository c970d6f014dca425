#include "formats/mask_structure_torch.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <limits>

#include "formats/mask_rows.h"

namespace attnreplay {
namespace {

using mask_rows::MaskRows;
using mask_rows::NotStructure;

// Per row of a block of batch entries, as int32 (n, heads, rows, kRowFields): the first key it
// sees, one past the last, how many it sees; for an additive mask also whether it adds a bias (a
// value neither 0 nor hiding) and whether it hides a key by a finite value.
enum RowField { kFirst, kEnd, kSeen, kBias, kFiniteHider, kRowFields };

// The dtype an additive mask is compared in, exactly: float32 holds every 16-bit value and
// kHidingAddend; double and integer masks are compared as doubles, as the host reads them.
c10::ScalarType comparison_type(const at::Tensor& mask) {
  return mask.scalar_type() == at::kDouble || at::isIntegralType(mask.scalar_type(), /*includeBool=*/false) ? at::kDouble
                                                                                                           : at::kFloat;
}

// Where an additive mask's values (in comparison_type) add a bias: neither 0 nor hiding a key.
at::Tensor biases(const at::Tensor& values) { return values.eq(0).logical_or(values.le(kHidingAddend)).logical_not(); }

at::Tensor row_fields(const at::Tensor& block, std::int64_t seq_kv) {
  at::Tensor seen_keys = block, bias, finite_hider;
  if (block.scalar_type() != at::kBool) {
    const at::Tensor values = block.to(comparison_type(block));
    seen_keys = values.eq(0);
    bias = biases(values);
    finite_hider = values.le(kHidingAddend).logical_and_(values.ne(-std::numeric_limits<double>::infinity()));
  }
  // argmax gives the first of equal maxima: the first key seen, and from the end the last.
  const at::Tensor bytes = seen_keys.view(at::kByte);
  std::vector<at::Tensor> fields(kRowFields);
  fields[kFirst] = bytes.argmax(-1);
  fields[kEnd] = bytes.flip(-1).argmax(-1).neg_().add_(seq_kv);
  fields[kSeen] = seen_keys.sum(-1);
  fields[kBias] = bias.defined() ? bias.any(-1) : at::zeros_like(fields[kFirst]);
  fields[kFiniteHider] = finite_hider.defined() ? finite_hider.any(-1) : at::zeros_like(fields[kFirst]);
  for (at::Tensor& field : fields) field = field.to(at::kInt);
  return at::stack(fields, -1).to(at::kCPU).contiguous();
}

// The first value of the row that is neither 0 nor hiding, for the reason given.
double first_bias(const at::Tensor& row) {
  const at::Tensor values = row.to(comparison_type(row));
  return values.masked_select(biases(values))[0].item<double>();
}

MaskRows rows_of_tensor(const at::Tensor& mask, const AttentionShape& s) {
  const at::Tensor full = mask.expand({s.batch, s.heads_q, s.seq_q, s.seq_kv});
  MaskRows out;
  // As formats/mask_view.h reads a host mask: a head dim of its own, and rows of its own, or not.
  out.heads = mask.dim() >= 3 && mask.size(-3) != 1 ? s.heads_q : 1;
  out.groups = s.batch * out.heads;
  out.seq_q = s.seq_q;
  const bool rows_alike = mask.dim() < 2 || (mask.size(-2) == 1 && s.seq_q > 1);
  const bool batch_alike = mask.dim() < 4 || mask.size(0) == 1;
  const std::int64_t rows = rows_alike ? 1 : s.seq_q, entries = batch_alike ? 1 : s.batch;
  const at::Tensor read = full.narrow(0, 0, entries).narrow(1, 0, out.heads).narrow(2, 0, rows);

  out.rows.resize(static_cast<std::size_t>(out.groups * s.seq_q));
  if (out.rows.empty() || s.seq_kv == 0) return out;  // no rows, or no keys for any to see

  // Batch entries a block at a time, so that the comparisons' temporaries stay near 2^25 elements.
  const std::int64_t per_entry = std::max<std::int64_t>(1, out.heads * rows * s.seq_kv);
  const std::int64_t block = std::max<std::int64_t>(1, (std::int64_t{1} << 25) / per_entry);
  std::vector<at::Tensor> blocks;
  for (std::int64_t first = 0; first < entries; first += block) {
    blocks.push_back(row_fields(read.narrow(0, first, std::min(block, entries - first)), s.seq_kv));
  }
  const at::Tensor fields = at::cat(blocks, 0);
  const std::int32_t* field = fields.data_ptr<std::int32_t>();

  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t h = 0; h < out.heads; ++h) {
      const std::int64_t g = b * out.heads + h;
      for (std::int64_t i = 0; i < s.seq_q; ++i) {
        auto& row = out.rows[static_cast<std::size_t>(g * s.seq_q + i)];
        if (rows_alike && i > 0) {
          row = out.at(g, 0);
          continue;
        }
        const std::int64_t entry = batch_alike ? 0 : b, r = rows_alike ? 0 : i;
        const std::int32_t* f = field + ((entry * out.heads + h) * rows + r) * kRowFields;
        if (f[kBias]) throw NotStructure{mask_rows::adds_a_bias(b, i, first_bias(read[entry][h][r]))};
        if (f[kSeen] == 0) {
          if (f[kFiniteHider]) throw NotStructure{mask_rows::hides_every_key_by_finite_values(b, i)};
          row = {};
        } else if (f[kSeen] != f[kEnd] - f[kFirst]) {
          throw NotStructure{mask_rows::not_one_range(b, i)};
        } else {
          row = {f[kFirst], f[kEnd]};
        }
      }
    }
  }
  return out;
}

}  // namespace

MaskReading read_mask_structure_of_tensor(const at::Tensor& mask, const AttentionShape& shape) {
  const c10::InferenceMode no_autograd;
  try {
    return mask_rows::fitted_reading(rows_of_tensor(mask, shape), shape);
  } catch (const NotStructure& dense) {
    MaskReading reading;
    reading.dense_reason = dense.reason;
    return reading;
  }
}

}  // namespace attnreplay
