#pragma once
// A call's mask read as torch broadcasts it (right-aligned) to (batch, heads_q, seq_q, seq_kv):
// the additive term of one score, 0 or -inf for a bool mask (true = may attend).
#include <cstdint>
#include <limits>
#include <optional>

#include "formats/attention_call.h"

namespace attnreplay {

class MaskView {
 public:
  MaskView(const std::optional<HostTensor>& tensor, const AttentionShape& s) {
    if (!tensor) return;
    mask_ = &*tensor;
    const std::int64_t full[4] = {s.batch, s.heads_q, s.seq_q, s.seq_kv};
    std::int64_t running = 1;
    for (int i = 0; i < mask_->rank(); ++i) {
      const int dim = mask_->rank() - 1 - i;
      stride_[3 - i] = (mask_->shape[dim] == 1 && full[3 - i] != 1) ? 0 : running;
      running *= mask_->shape[dim];
    }
  }

  explicit operator bool() const { return mask_ != nullptr; }
  DType dtype() const { return mask_->dtype; }
  // Whether the mask has a row of its own for each query head (else one, broadcast to all).
  bool per_head() const { return stride_[1] != 0; }
  // Row (b, h, i)'s first element, where its keys lie one after another (else null).
  const std::byte* contiguous_row(std::int64_t b, std::int64_t h, std::int64_t i) const {
    if (stride_[3] != 1) return nullptr;
    const std::int64_t base = b * stride_[0] + h * stride_[1] + i * stride_[2];
    return mask_->data() + static_cast<std::size_t>(base) * dtype_size(mask_->dtype);
  }

  // The additive term for keys first_key .. first_key + count - 1 of row (b, h, i).
  template <typename Value>
  void row(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t first_key, std::int64_t count,
           Value* bias) const {
    const std::int64_t base = b * stride_[0] + h * stride_[1] + i * stride_[2] + first_key * stride_[3];
    const std::size_t size = dtype_size(mask_->dtype);
    const std::byte* data = mask_->data();
    for (std::int64_t j = 0; j < count; ++j) {
      const double value = element_to_double(mask_->dtype, data + static_cast<std::size_t>(base + j * stride_[3]) * size);
      if (mask_->dtype == DType::boolean) bias[j] = value != 0.0 ? Value(0) : -std::numeric_limits<Value>::infinity();
      else bias[j] = static_cast<Value>(value);
    }
  }

 private:
  const HostTensor* mask_ = nullptr;
  std::int64_t stride_[4] = {0, 0, 0, 0};
};

}  // namespace attnreplay
