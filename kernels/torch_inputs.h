#pragma once
// A call's Q, K, V and mask as libtorch tensors on a device, as the model passed them: the kernels
// that hand tensors to torch (its SDPA backends, Python plug-ins) start from these.
#include <ATen/core/Tensor.h>

#include <optional>

#include "formats/attention_call.h"

namespace attnreplay {

// Q, K, V with the model's strides restored, as (b, h, s, d) views (BSHD calls are transposed
// views, which cost nothing); the mask as captured.
struct ModelInputs {
  at::Tensor q, k, v;
  std::optional<at::Tensor> mask;
};

ModelInputs model_inputs(const AttentionCall& call, at::Device device);

// The GPU this process runs on: the current CUDA device, which a sharded run sets to its local one
// (replay/sharding.h). Every GPU kernel and the GPU reference put their tensors there.
at::Device current_gpu();

}  // namespace attnreplay
