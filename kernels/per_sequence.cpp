#include "kernels/per_sequence.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "formats/errors.h"
#include "formats/mask_structure.h"
#include "kernels/device_output.h"
#include "kernels/resident_kernel.h"

namespace attnreplay {
namespace {

// One prepared kernel per sequence that has queries; a sequence without keys has rows of 0, as
// flash-attn gives (the reference marks them as seeing no key).
class PreparedPerSequence final : public PreparedKernel, public DeviceOutput {
 public:
  struct Part {
    std::int64_t batch = 0, first_row = 0, rows = 0;  // where its rows go in the call's output
    std::unique_ptr<PreparedKernel> kernel;  // null: no keys
  };
  PreparedPerSequence(std::vector<Part> parts, AttentionShape shape) : parts_(std::move(parts)), shape_(shape) {
    std::vector<PreparedKernel*> prepared;
    for (const Part& part : parts_) {
      if (!part.kernel) continue;
      prepared.push_back(part.kernel.get());
      preparation_ = preparation_ || part.kernel->has_preparation();
      on_stream_ = on_stream_ && part.kernel->runs_on_current_stream();
      on_device_ = on_device_ && dynamic_cast<DeviceOutput*>(part.kernel.get()) != nullptr;
    }
    // Where the kernel's calls join launches, one launch for them all rather than one each.
    if (prepared.size() > 1) {
      if (auto* joins = dynamic_cast<JoinsLaunches*>(prepared.front())) together_ = joins->join(prepared);
    }
  }
  void run() override {
    if (together_) return together_->run();
    for (Part& part : parts_)
      if (part.kernel) part.kernel->run();
  }
  void synchronize() override {
    for (Part& part : parts_)
      if (part.kernel) part.kernel->synchronize();
  }
  bool has_preparation() const override { return preparation_; }
  void prepare_inputs() override {
    for (Part& part : parts_)
      if (part.kernel) part.kernel->prepare_inputs();
  }
  bool runs_on_current_stream() const override { return on_stream_; }
  double preparation_bytes() const override {
    double bytes = 0;
    for (const Part& part : parts_)
      if (part.kernel) bytes += part.kernel->preparation_bytes();
    return bytes;
  }

  HostTensor output() override {
    const std::int64_t heads = shape_.heads_q, dim = shape_.head_dim_vo;
    std::vector<HostTensor> outputs;
    DType dtype = DType::float32;
    for (Part& part : parts_) {
      outputs.push_back(part.kernel ? part.kernel->output() : HostTensor{});
      if (part.kernel) dtype = outputs.back().dtype;
    }
    HostTensor whole = HostTensor::allocate(dtype, {shape_.batch, heads, shape_.seq_q, dim});
    std::byte* out = whole.mutable_data();
    std::memset(out, 0, whole.nbytes());  // rows of no part, or of a part without keys
    const std::size_t row_bytes = static_cast<std::size_t>(dim) * dtype_size(dtype);
    for (std::size_t i = 0; i < parts_.size(); ++i) {
      const Part& part = parts_[i];
      if (!part.kernel) continue;
      for (std::int64_t h = 0; h < heads; ++h) {
        std::memcpy(out + static_cast<std::size_t>((part.batch * heads + h) * shape_.seq_q + part.first_row) * row_bytes,
                    outputs[i].data() + static_cast<std::size_t>(h * part.rows) * row_bytes,
                    static_cast<std::size_t>(part.rows) * row_bytes);
      }
    }
    return whole;
  }

  // Only while every part's output is on the device (DeviceOutput): the runner asks through
  // dynamic_cast, so the others' outputs come through output().
  at::Tensor device_output() override {
    std::optional<at::Tensor> whole;
    for (Part& part : parts_) {
      if (!part.kernel) continue;
      const at::Tensor piece = dynamic_cast<DeviceOutput&>(*part.kernel).device_output();
      if (!whole) whole = at::zeros({shape_.batch, shape_.heads_q, shape_.seq_q, shape_.head_dim_vo}, piece.options());
      whole->select(0, part.batch).narrow(1, part.first_row, part.rows).copy_(piece.select(0, 0));
    }
    if (!whole) return at::zeros({shape_.batch, shape_.heads_q, shape_.seq_q, shape_.head_dim_vo});
    return *whole;
  }
  bool outputs_on_device() const { return on_device_; }

 private:
  std::vector<Part> parts_;
  AttentionShape shape_;
  std::unique_ptr<JointLaunch> together_;
  bool preparation_ = false, on_stream_ = true, on_device_ = true;
};

// The same with its output through the host only, for kernels some of whose parts are not
// DeviceOutput.
class HostOutputOnly final : public PreparedKernel {
 public:
  explicit HostOutputOnly(std::unique_ptr<PreparedPerSequence> kernel) : kernel_(std::move(kernel)) {}
  void run() override { kernel_->run(); }
  void synchronize() override { kernel_->synchronize(); }
  HostTensor output() override { return kernel_->output(); }
  bool has_preparation() const override { return kernel_->has_preparation(); }
  void prepare_inputs() override { kernel_->prepare_inputs(); }
  bool runs_on_current_stream() const override { return kernel_->runs_on_current_stream(); }
  double preparation_bytes() const override { return kernel_->preparation_bytes(); }

 private:
  std::unique_ptr<PreparedPerSequence> kernel_;
};

}  // namespace

namespace {

// The call's parts, each with where its rows go: a ragged call's sequences (into the packed view's
// batch 0) or a dense call's batch entries cut to their key ranges.
std::vector<SequencePart> parts_of(const AttentionCall& call, bool with_data) {
  if (!call.is_ragged()) {
    auto parts = split_by_key_ranges(call, with_data);
    ATTNREPLAY_ASSERT(parts.has_value(), "runs_per_sequence() chose the call");
    return std::move(*parts);
  }
  const auto sequences = call.sequences();
  std::vector<SequencePart> parts;
  for (std::size_t b = 0; b < sequences.size(); ++b) {
    if (sequences[b].q_len == 0) continue;
    const bool keys = sequences[b].k_len > 0;
    parts.push_back({static_cast<std::int64_t>(b), 0, sequences[b].q_begin, sequences[b].q_len, sequences[b].k_begin,
                     sequences[b].k_len, call.sequence_call(b, sequences, with_data && keys)});
  }
  return parts;
}

}  // namespace

bool runs_per_sequence(const KernelDescription& kernel, const AttentionCall& call) {
  if (call.is_ragged()) return !(call.is_paged() ? kernel.paged : kernel.ragged);
  return kernel.masks == KernelDescription::Masks::diagonals && splits_by_key_ranges(call);
}

std::optional<std::string> PerSequenceKernel::unsupported_reason(const AttentionCall& call) const {
  // Shapes only: the data is gathered once, in prepare().
  const std::vector<SequencePart> parts = parts_of(call, /*with_data=*/false);
  const std::int64_t count = call.is_ragged() ? call.check_ragged_fields() : call.shape().batch;
  // A reason every part has (no device, a dtype) is the call's; else the first part declined is named.
  std::optional<std::string> first;
  const SequencePart* first_part = nullptr;
  bool every_part_alike = true;
  for (const SequencePart& part : parts) {
    if (part.keys == 0) continue;
    const auto reason = kernel_.unsupported_reason(part.call);
    if (reason && !first) first = reason, first_part = &part;
    every_part_alike = every_part_alike && reason && reason == first;
  }
  if (!first) return std::nullopt;
  if (every_part_alike) return first;
  return fmt::format("{} {} of {}, run alone: {}", call.is_ragged() ? "sequence" : "batch entry", first_part->sequence,
                     count, *first);
}

namespace {

// Several sequences run together (one launch, or one after another as the substitution runs them):
// none splits its keys, so that every path runs a batch alike (docs/quantized.md, "Key splits").
KernelOptions for_sequences(const std::vector<SequencePart>& parts, KernelOptions options) {
  const auto with_keys = std::count_if(parts.begin(), parts.end(), [](const SequencePart& p) { return p.keys > 0; });
  if (with_keys > 1) options.split_keys = false;
  return options;
}

}  // namespace

std::unique_ptr<PreparedKernel> PerSequenceKernel::prepare(const AttentionCall& call, const KernelOptions& given) const {
  std::vector<PreparedPerSequence::Part> parts;
  std::vector<SequencePart> sequences = parts_of(call, /*with_data=*/true);
  const KernelOptions options = for_sequences(sequences, given);
  for (SequencePart& sequence : sequences) {
    PreparedPerSequence::Part part;
    part.batch = sequence.batch;
    part.first_row = sequence.first_row;
    part.rows = sequence.rows;
    if (sequence.keys > 0) part.kernel = kernel_.prepare(sequence.call, options);
    parts.push_back(std::move(part));
  }
  auto prepared = std::make_unique<PreparedPerSequence>(std::move(parts), call.shape());
  if (prepared->outputs_on_device()) return prepared;
  return std::make_unique<HostOutputOnly>(std::move(prepared));
}

at::Tensor run_resident_per_sequence(const ResidentKernel& kernel, const AttentionCall& call, const ModelInputs& inputs,
                                     const KernelOptions& given) {
  const AttentionShape s = call.shape();
  at::Tensor out = at::zeros({s.batch, s.heads_q, s.seq_q, s.head_dim_vo}, inputs.q.options());
  const std::vector<SequencePart> sequences = parts_of(call, /*with_data=*/false);
  const KernelOptions options = for_sequences(sequences, given);
  for (const SequencePart& part : sequences) {
    if (part.keys == 0) continue;
    auto rows = [&](const at::Tensor& t, std::int64_t first, std::int64_t count) {
      return t.select(0, part.batch).narrow(1, first, count).unsqueeze(0);
    };
    const ModelInputs one{rows(inputs.q, part.first_row, part.rows), rows(inputs.k, part.first_key, part.keys),
                          rows(inputs.v, part.first_key, part.keys), std::nullopt};
    out.select(0, part.batch).narrow(1, part.first_row, part.rows).copy_(kernel.run_resident(part.call, one, options).select(0, 0));
  }
  return out;
}

}  // namespace attnreplay
