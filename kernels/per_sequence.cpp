#include "kernels/per_sequence.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstring>

#include "kernels/device_output.h"

namespace attnreplay {
namespace {

// One prepared kernel per sequence that has queries; a sequence without keys has rows of 0, as
// flash-attn gives (the reference marks them as seeing no key).
class PreparedPerSequence final : public PreparedKernel, public DeviceOutput {
 public:
  struct Part {
    std::int64_t rows = 0;
    std::unique_ptr<PreparedKernel> kernel;  // null: no keys
  };
  PreparedPerSequence(std::vector<Part> parts, AttentionShape packed) : parts_(std::move(parts)), packed_(packed) {
    for (const Part& part : parts_) {
      if (!part.kernel) continue;
      preparation_ = preparation_ || part.kernel->has_preparation();
      on_stream_ = on_stream_ && part.kernel->runs_on_current_stream();
      on_device_ = on_device_ && dynamic_cast<DeviceOutput*>(part.kernel.get()) != nullptr;
    }
  }
  void run() override {
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
    const std::int64_t heads = packed_.heads_q, dim = packed_.head_dim_vo;
    std::vector<HostTensor> outputs;
    DType dtype = DType::float32;
    for (Part& part : parts_) {
      outputs.push_back(part.kernel ? part.kernel->output() : HostTensor{});
      if (part.kernel) dtype = outputs.back().dtype;
    }
    HostTensor packed = HostTensor::allocate(dtype, {1, heads, packed_.seq_q, dim});
    std::byte* out = packed.mutable_data();
    std::memset(out, 0, packed.nbytes());  // rows without keys
    const std::size_t row_bytes = static_cast<std::size_t>(dim) * dtype_size(dtype);
    std::int64_t first = 0;
    for (std::size_t i = 0; i < parts_.size(); ++i) {
      const std::int64_t rows = parts_[i].rows;
      if (parts_[i].kernel) {
        for (std::int64_t h = 0; h < heads; ++h) {
          std::memcpy(out + static_cast<std::size_t>(h * packed_.seq_q + first) * row_bytes,
                      outputs[i].data() + static_cast<std::size_t>(h * rows) * row_bytes,
                      static_cast<std::size_t>(rows) * row_bytes);
        }
      }
      first += rows;
    }
    return packed;
  }

  // Only while every part's output is on the device (DeviceOutput): the runner asks through
  // dynamic_cast, so the others' outputs come through output().
  at::Tensor device_output() override {
    std::vector<at::Tensor> pieces;
    at::TensorOptions options;
    for (Part& part : parts_) {
      if (!part.kernel) continue;
      pieces.push_back(dynamic_cast<DeviceOutput&>(*part.kernel).device_output());
      options = pieces.back().options();
    }
    std::vector<at::Tensor> ordered;
    std::size_t next = 0;
    for (const Part& part : parts_) {
      ordered.push_back(part.kernel ? pieces[next++] : at::zeros({1, packed_.heads_q, part.rows, packed_.head_dim_vo}, options));
    }
    return at::cat(ordered, 2);
  }
  bool outputs_on_device() const { return on_device_; }

 private:
  std::vector<Part> parts_;
  AttentionShape packed_;
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

std::optional<std::string> PerSequenceKernel::unsupported_reason(const AttentionCall& call) const {
  const auto sequences = call.sequences();
  for (std::size_t b = 0; b < sequences.size(); ++b) {
    if (sequences[b].q_len == 0 || sequences[b].k_len == 0) continue;
    // Shapes only: the data is gathered once, in prepare().
    if (auto reason = kernel_.unsupported_reason(call.sequence_call(b, sequences, /*with_data=*/false))) {
      return fmt::format("sequence {} of {}, run alone: {}", b, sequences.size(), *reason);
    }
  }
  return std::nullopt;
}

std::unique_ptr<PreparedKernel> PerSequenceKernel::prepare(const AttentionCall& call, const KernelOptions& options) const {
  const auto sequences = call.sequences();
  std::vector<PreparedPerSequence::Part> parts;
  for (std::size_t b = 0; b < sequences.size(); ++b) {
    if (sequences[b].q_len == 0) continue;
    PreparedPerSequence::Part part;
    part.rows = sequences[b].q_len;
    if (sequences[b].k_len > 0) part.kernel = kernel_.prepare(call.sequence_call(b, sequences), options);
    parts.push_back(std::move(part));
  }
  auto prepared = std::make_unique<PreparedPerSequence>(std::move(parts), call.shape());
  if (prepared->outputs_on_device()) return prepared;
  return std::make_unique<HostOutputOnly>(std::move(prepared));
}

}  // namespace attnreplay
