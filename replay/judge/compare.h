#pragma once
// A kernel's output against the exact reference: the error statistics of replay/judge/error_stats.h,
// computed where the reference is (on the GPU when it ran there).
#include <ATen/core/Tensor.h>

#include <vector>

#include "formats/host_tensor.h"
#include "kernels/reference.h"
#include "replay/judge/error_stats.h"

namespace attnreplay {

// `output` is (batch, heads_q, seq_q, head_dim_vo) in any dtype; compared on the reference's rows.
ErrorStats compare_to_reference(const HostTensor& output, const ReferenceOutput& reference);
// The same for an output already in a torch tensor (b, h_q, s_q, d_vo), on any device: a GPU
// kernel's output is compared where the reference is without a trip through the host.
ErrorStats compare_to_reference(const at::Tensor& output, const ReferenceOutput& reference);

// One entry per (batch, head), batch-major; the same shape check as compare_to_reference.
std::vector<HeadError> compare_per_head(const HostTensor& output, const ReferenceOutput& reference);

}  // namespace attnreplay
