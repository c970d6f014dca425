#include "kernels/reference.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <thread>

#include "formats/errors.h"
#include "formats/mask_view.h"
#include "kernels/kernel.h"

namespace attnreplay {
namespace {

// A head of K or V in fp64, (seq, dim) row-major, converted once and shared by its query heads.
std::vector<double> head_as_doubles(const HostTensor& bhsd, std::int64_t b, std::int64_t h) {
  const std::int64_t heads = bhsd.shape[1], seq = bhsd.shape[2], dim = bhsd.shape[3];
  std::vector<double> out(static_cast<std::size_t>(seq * dim));
  const std::size_t size = dtype_size(bhsd.dtype);
  const std::byte* base = bhsd.data() + static_cast<std::size_t>((b * heads + h) * seq * dim) * size;
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = element_to_double(bhsd.dtype, base + i * size);
  return out;
}

}  // namespace

std::vector<std::int64_t> sample_query_rows(std::int64_t seq_q, std::int64_t count, std::uint64_t seed) {
  std::vector<std::int64_t> all(static_cast<std::size_t>(seq_q));
  std::iota(all.begin(), all.end(), 0);
  if (count >= seq_q) return all;
  std::mt19937_64 generator(seed);
  std::vector<std::int64_t> picked;
  std::sample(all.begin(), all.end(), std::back_inserter(picked), count, generator);
  std::sort(picked.begin(), picked.end());
  return picked;
}

ReferenceOutput reference_output_for(const AttentionShape& s, std::vector<std::int64_t> rows) {
  ReferenceOutput result;
  result.shape = s;
  result.sampled = !rows.empty() && static_cast<std::int64_t>(rows.size()) < s.seq_q;
  if (rows.empty()) {
    rows.resize(static_cast<std::size_t>(s.seq_q));
    std::iota(rows.begin(), rows.end(), 0);
  }
  result.rows = std::move(rows);
  return result;
}

void host_values(ReferenceOutput& reference) {
  if (!reference.values.empty() || !reference.device_values) return;
  const at::Tensor host = reference.device_values->to(at::kCPU).contiguous();
  reference.values.assign(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
}

namespace {

void mark_dense_rows_without_keys(const AttentionCall& call, ReferenceOutput& reference) {
  const AttentionShape& s = reference.shape;
  // Only a mask, or causality or a window that cuts away every key of some row, hides a row.
  const bool window_may_hide = call.window_left || call.window_right;
  if (!call.mask && !(call.is_causal && call.diagonal_offset(s) < 0) && !window_may_hide) return;
  const MaskView mask(call.mask, s);
  const auto n_rows = static_cast<std::int64_t>(reference.rows.size());
  std::vector<std::uint8_t> no_key(static_cast<std::size_t>(s.batch * s.heads_q * n_rows), 0);
  std::vector<double> bias(static_cast<std::size_t>(s.seq_kv), 0.0);
  bool any = false;
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.heads_q; ++h)
      for (std::int64_t slot = 0; slot < n_rows; ++slot) {
        const std::int64_t i = reference.rows[static_cast<std::size_t>(slot)];
        const auto [key_first, key_end] = call.visible_keys(i, s);
        bool sees = key_end > key_first;
        if (sees && mask) {
          mask.row(b, h, i, key_first, key_end - key_first, bias.data());
          sees = std::any_of(bias.begin(), bias.begin() + (key_end - key_first),
                             [](double v) { return v != -std::numeric_limits<double>::infinity(); });
        }
        if (!sees) no_key[static_cast<std::size_t>((b * s.heads_q + h) * n_rows + slot)] = 1, any = true;
      }
  if (any) reference.no_key = std::move(no_key);
}

}  // namespace

void mark_rows_without_keys(const AttentionCall& call, ReferenceOutput& reference) {
  if (!call.is_ragged()) mark_dense_rows_without_keys(call, reference);  // else reference_per_sequence() did
  if (reference.device_values && !reference.no_key.empty()) {
    reference.device_no_key = at::from_blob(reference.no_key.data(), {static_cast<std::int64_t>(reference.no_key.size())},
                                            at::TensorOptions().dtype(at::kByte))
                                  .to(reference.device_values->device());
  }
}

ReferenceOutput reference_per_sequence(const AttentionCall& call, std::vector<std::int64_t> rows,
                                       const SequenceReference& compute) {
  ReferenceOutput result = reference_output_for(call.shape(), std::move(rows));
  const AttentionShape& s = result.shape;
  const std::vector<AttentionCall::Sequence> sequences = call.sequences();
  const auto n_rows = static_cast<std::int64_t>(result.rows.size());
  struct Part {
    std::int64_t first_slot = 0, count = 0;
    ReferenceOutput output;  // empty for a sequence without keys
  };
  std::vector<Part> parts;
  std::vector<std::uint8_t> no_key(static_cast<std::size_t>(s.heads_q * n_rows), 0);
  bool any_no_key = false, on_device = false;
  std::int64_t slot = 0;
  for (std::size_t b = 0; b < sequences.size(); ++b) {
    const AttentionCall::Sequence& sequence = sequences[b];
    Part part;
    part.first_slot = slot;
    std::vector<std::int64_t> local;
    for (; slot < n_rows && result.rows[static_cast<std::size_t>(slot)] < sequence.q_begin + sequence.q_len; ++slot) {
      local.push_back(result.rows[static_cast<std::size_t>(slot)] - sequence.q_begin);
    }
    part.count = static_cast<std::int64_t>(local.size());
    if (part.count == 0) continue;
    if (sequence.k_len == 0) {
      result.fully_masked_rows += s.heads_q * part.count;
      for (std::int64_t h = 0; h < s.heads_q; ++h)
        for (std::int64_t i = 0; i < part.count; ++i) no_key[static_cast<std::size_t>(h * n_rows + part.first_slot + i)] = 1;
      any_no_key = true;
    } else {
      const AttentionCall one = call.sequence_call(b, sequences);
      part.output = compute(one, std::move(local));
      // The dense marking only: the marks of the whole call go to the GPU once, after the parts are
      // joined (mark_rows_without_keys, called on the result).
      mark_dense_rows_without_keys(one, part.output);
      result.fully_masked_rows += part.output.fully_masked_rows;
      on_device = on_device || part.output.device_values.has_value();
      if (!part.output.no_key.empty()) {
        any_no_key = true;
        for (std::int64_t h = 0; h < s.heads_q; ++h)
          for (std::int64_t i = 0; i < part.count; ++i)
            no_key[static_cast<std::size_t>(h * n_rows + part.first_slot + i)] =
                part.output.no_key[static_cast<std::size_t>(h * part.count + i)];
      }
    }
    parts.push_back(std::move(part));
  }
  if (any_no_key) result.no_key = std::move(no_key);
  if (on_device) {
    at::TensorOptions options;
    for (const Part& part : parts)
      if (part.output.device_values) options = part.output.device_values->options();
    std::vector<at::Tensor> pieces;
    for (const Part& part : parts) {
      pieces.push_back(part.output.device_values ? *part.output.device_values
                                                 : at::zeros({1, s.heads_q, part.count, s.head_dim_vo}, options));
    }
    result.device_values = at::cat(pieces, 2);
    return result;
  }
  result.values.assign(static_cast<std::size_t>(s.heads_q * n_rows * s.head_dim_vo), 0.0);
  for (const Part& part : parts) {
    if (part.output.values.empty()) continue;
    for (std::int64_t h = 0; h < s.heads_q; ++h) {
      std::copy_n(part.output.values.begin() + h * part.count * s.head_dim_vo, part.count * s.head_dim_vo,
                  result.values.begin() + (h * n_rows + part.first_slot) * s.head_dim_vo);
    }
  }
  return result;
}

ReferenceOutput reference_attention(const AttentionCall& call, std::vector<std::int64_t> rows, unsigned threads) {
  if (call.is_ragged()) {
    return reference_per_sequence(call, std::move(rows), [threads](const AttentionCall& one, std::vector<std::int64_t> r) {
      return reference_attention(one, std::move(r), threads);
    });
  }
  const AttentionShape s = call.shape();
  ReferenceOutput result = reference_output_for(s, std::move(rows));
  const auto n_rows = static_cast<std::int64_t>(result.rows.size());
  result.values.assign(static_cast<std::size_t>(s.batch * s.heads_q * n_rows * s.head_dim_vo), 0.0);

  const HostTensor q = to_bhsd(call.q, call.layout);
  const HostTensor k = to_bhsd(call.k, call.layout);
  const HostTensor v = to_bhsd(call.v, call.layout);
  const MaskView mask(call.mask, s);
  const double scale = call.softmax_scale();
  const double softcap = call.softcap;
  const std::int64_t group = s.heads_q / s.heads_kv;
  const std::int64_t diagonal_offset = call.diagonal_offset(s);
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::int64_t> fully_masked(threads, 0);

  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t hk = 0; hk < s.heads_kv; ++hk) {
      const std::vector<double> keys = head_as_doubles(k, b, hk);
      const std::vector<double> values = head_as_doubles(v, b, hk);
      // Work items: (query head in this group, row slot).
      const std::int64_t items = group * n_rows;
      auto worker = [&](unsigned t) {
        std::vector<double> query(static_cast<std::size_t>(s.head_dim_qk));
        std::vector<double> bias(static_cast<std::size_t>(s.seq_kv), 0.0);
        std::vector<double> accumulator(static_cast<std::size_t>(s.head_dim_vo));
        for (std::int64_t item = t; item < items; item += threads) {
          const std::int64_t h = hk * group + item / n_rows;
          const auto slot = static_cast<std::size_t>(item % n_rows);
          const std::int64_t i = result.rows[slot];
          const std::size_t esize = dtype_size(q.dtype);
          const std::byte* q_row = q.data() + static_cast<std::size_t>(((b * s.heads_q + h) * s.seq_q + i) * s.head_dim_qk) * esize;
          for (std::int64_t d = 0; d < s.head_dim_qk; ++d) query[d] = element_to_double(q.dtype, q_row + d * esize);
          if (mask) mask.row(b, h, i, 0, s.seq_kv, bias.data());
          const auto [key_first, key_end] = call.visible_keys(i, s);
          const double slope = call.alibi_slope(b, h);
          // Online softmax: running max m, running sum l, output accumulator, all fp64.
          double m = -std::numeric_limits<double>::infinity();
          double l = 0.0;
          std::fill(accumulator.begin(), accumulator.end(), 0.0);
          // A logit that joins the sum with weight exp(score - m) and adds p * value.
          auto add = [&](double score, const double* value) {
            if (score == -std::numeric_limits<double>::infinity()) return;
            if (score > m) {
              const double rescale = std::exp(m - score);
              l *= rescale;
              for (double& a : accumulator) a *= rescale;
              m = score;
            }
            const double p = std::exp(score - m);
            l += p;
            if (value) for (std::int64_t d = 0; d < s.head_dim_vo; ++d) accumulator[d] += p * value[d];
          };
          for (std::int64_t j = key_first; j < key_end; ++j) {
            const double* key = keys.data() + j * s.head_dim_qk;
            double dot = 0.0;
            for (std::int64_t d = 0; d < s.head_dim_qk; ++d) dot += query[d] * key[d];
            double score = dot * scale;
            if (softcap > 0) score = softcap * std::tanh(score / softcap);
            score += bias[static_cast<std::size_t>(j)];
            if (slope != 0) score -= slope * static_cast<double>(std::abs(i + diagonal_offset - j));
            add(score, values.data() + j * s.head_dim_vo);
          }
          double* out = result.values.data() + ((b * s.heads_q + h) * n_rows + static_cast<std::int64_t>(slot)) * s.head_dim_vo;
          if (l == 0.0 || !std::isfinite(m)) {
            ++fully_masked[t];
            continue;  // stays 0, with or without a sink
          }
          add(call.sink(h), nullptr);  // a sink takes its share of the row's weight, and adds nothing
          for (std::int64_t d = 0; d < s.head_dim_vo; ++d) out[d] = accumulator[d] / l;
        }
      };
      std::vector<std::jthread> pool;
      for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker, t);
      worker(0);
    }
  }
  for (std::int64_t count : fully_masked) result.fully_masked_rows += count;
  return result;
}

namespace {

class PreparedReference final : public PreparedKernel {
 public:
  PreparedReference(const AttentionCall& call, ReferenceKernel::Compute compute) : call_(call), compute_(compute) {}
  void run() override { output_ = compute_(call_); }
  HostTensor output() override {
    const AttentionShape& s = output_.shape;
    return HostTensor::from_doubles(DType::float64, {s.batch, s.heads_q, s.seq_q, s.head_dim_vo}, output_.values);
  }

 private:
  AttentionCall call_;
  ReferenceKernel::Compute compute_;
  ReferenceOutput output_;
};

}  // namespace

std::optional<std::string> ReferenceKernel::unsupported_reason(const AttentionCall&) const {
  if (available_ && !available_()) return "no CUDA device";
  return std::nullopt;
}

std::unique_ptr<PreparedKernel> ReferenceKernel::prepare(const AttentionCall& call, const KernelOptions&) const {
  return std::make_unique<PreparedReference>(call, compute_);
}

namespace {

const bool references_registered = KernelRegistry::instance().add(std::make_unique<ReferenceKernel>(
    KernelDescription{"reference",
                      "exact attention in fp64 on the CPU, streaming over keys (what errors are measured against)",
                      "cpu", true, std::nullopt, Extensions::all(), /*ragged=*/true, /*paged=*/true},
    [](const AttentionCall& call) { return reference_attention(call); }, nullptr));

}  // namespace
}  // namespace attnreplay
