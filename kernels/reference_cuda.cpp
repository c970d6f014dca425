// The exact reference on a GPU, for calls too large for the CPU one: the same mathematics in fp64,
// inputs upcast. Calls without a mask and with head dims up to 128 take the fused path (one
// streaming pass over the keys, cuda/reference_fused.cu); others take cuBLAS DGEMMs and an fp64
// softmax in chunks of query rows, so that no s_q x s_kv matrix is ever whole. Both are checked
// against the CPU reference in the GPU tests.
#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <limits>
#include <numeric>

#include "formats/errors.h"
#include "formats/torch_tensor.h"
#include "kernels/kernel.h"
#include "kernels/reference.h"

#ifdef ATTNREPLAY_FUSED_REFERENCE
#include "kernels/cuda/reference_fused.h"
#endif

namespace attnreplay {
namespace {

constexpr std::int64_t kScoreChunkBytes = 1ll << 30;  // one chunk of fp64 scores

at::Tensor to_gpu_fp64(const HostTensor& tensor, Layout layout) {
  const at::Tensor host = torch_from_host_tensor(to_bhsd(tensor, layout), /*restore_strides=*/false);
  return host.to(at::Device(at::kCUDA, 0)).to(at::kDouble);
}

// The additive mask broadcast to (b, h_q, rows, s_kv) lazily: bool masks become 0 / -inf.
at::Tensor additive_mask(const AttentionCall& call, const at::Tensor& rows) {
  at::Tensor mask = torch_from_host_tensor(*call.mask, false).to(at::Device(at::kCUDA, 0));
  while (mask.dim() < 4) mask = mask.unsqueeze(0);
  if (mask.size(2) != 1) mask = mask.index_select(2, rows);
  if (mask.scalar_type() == at::kBool) {
    return at::zeros(mask.sizes(), mask.options().dtype(at::kDouble))
        .masked_fill_(mask.logical_not(), -std::numeric_limits<double>::infinity());
  }
  return mask.to(at::kDouble);
}

}  // namespace

bool gpu_reference_available() { return at::detail::getCUDAHooks().hasCUDA(); }

ReferenceOutput reference_attention_gpu(const AttentionCall& call, std::vector<std::int64_t> rows) {
  ATTNREPLAY_ASSERT(gpu_reference_available(), "GPU reference without a GPU");
  at::InferenceMode inference;
  const AttentionShape s = call.shape();
  ReferenceOutput result = reference_output_for(s, std::move(rows));
  const auto n_rows = static_cast<std::int64_t>(result.rows.size());
  const auto device = at::Device(at::kCUDA, 0);
  const at::Tensor row_index = at::tensor(result.rows, at::TensorOptions().dtype(at::kLong)).to(device);
  const at::Tensor q = to_gpu_fp64(call.q, call.layout).index_select(2, row_index);
  const at::Tensor k = to_gpu_fp64(call.k, call.layout);
  const at::Tensor v = to_gpu_fp64(call.v, call.layout);
  const std::optional<at::Tensor> mask = call.mask ? std::optional(additive_mask(call, row_index)) : std::nullopt;
  const double scale = call.softmax_scale();
  const std::int64_t group = s.heads_q / s.heads_kv;
  const std::int64_t offset = call.causal_alignment == CausalAlignment::bottom_right ? s.seq_kv - s.seq_q : 0;
  // Rows can be fully masked only with a mask, or bottom-right causal with more queries than keys.
  const bool may_mask_rows = call.mask || (call.is_causal && offset < 0);
#ifdef ATTNREPLAY_FUSED_REFERENCE
  if (!call.mask && fused_reference_supports(s.head_dim_qk, s.head_dim_vo)) {
    const at::Tensor out = at::empty({s.batch, s.heads_q, n_rows, s.head_dim_vo}, q.options());
    const at::Tensor empty_rows = at::zeros({1}, row_index.options());
    const at::Tensor q_rows = q.contiguous();
    FusedReferenceProblem problem;
    problem.q = q_rows.data_ptr<double>();
    problem.k = k.data_ptr<double>();
    problem.v = v.data_ptr<double>();
    problem.out = out.data_ptr<double>();
    problem.positions = row_index.data_ptr<std::int64_t>();
    problem.batch = s.batch;
    problem.heads_q = s.heads_q;
    problem.heads_kv = s.heads_kv;
    problem.rows = n_rows;
    problem.seq_kv = s.seq_kv;
    problem.head_dim = s.head_dim_qk;
    problem.head_dim_vo = s.head_dim_vo;
    problem.causal = call.is_causal;
    problem.causal_offset = offset;
    problem.scale = scale;
    problem.fully_masked_rows = reinterpret_cast<unsigned long long*>(empty_rows.data_ptr<std::int64_t>());
    // torch's tensors above were made on the default stream, which this launch follows.
    if (const char* error = launch_fused_reference(problem, nullptr)) {
      throw std::runtime_error(std::string("GPU reference: ") + error);
    }
    result.fully_masked_rows = empty_rows.item<std::int64_t>();
    result.values.resize(static_cast<std::size_t>(out.numel()));
    at::from_blob(result.values.data(), out.sizes(), at::TensorOptions().dtype(at::kDouble)).copy_(out);
    return result;
  }
#endif
  const std::int64_t chunk = std::max<std::int64_t>(1, kScoreChunkBytes / (8 * s.seq_kv));
  at::Tensor out = at::zeros({s.batch, s.heads_q, n_rows, s.head_dim_vo}, q.options());
  const at::Tensor keys = at::arange(s.seq_kv, row_index.options());
  std::int64_t fully_masked = 0;
  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t h = 0; h < s.heads_q; ++h) {
      const at::Tensor kh = k[b][h / group];
      const at::Tensor vh = v[b][h / group];
      for (std::int64_t r0 = 0; r0 < n_rows; r0 += chunk) {
        const std::int64_t r1 = std::min(n_rows, r0 + chunk);
        at::Tensor scores = at::matmul(q[b][h].slice(0, r0, r1), kh.t()).mul_(scale);
        if (mask) {
          const at::Tensor& m = *mask;
          scores.add_(m[m.size(0) == 1 ? 0 : b][m.size(1) == 1 ? 0 : h].slice(0, m.size(2) == 1 ? 0 : r0,
                                                                               m.size(2) == 1 ? 1 : r1));
        }
        if (call.is_causal) {
          const at::Tensor positions = row_index.slice(0, r0, r1).unsqueeze(1);
          scores.masked_fill_(keys.unsqueeze(0) > positions + offset, -std::numeric_limits<double>::infinity());
        }
        at::Tensor probabilities = at::softmax(scores, -1);
        if (may_mask_rows) {
          // softmax over all -inf gives NaN; such a row's output is 0, as the CPU reference gives.
          const at::Tensor empty = std::get<0>(scores.max(-1)).eq(-std::numeric_limits<double>::infinity());
          fully_masked += empty.sum().item<std::int64_t>();
          probabilities.masked_fill_(empty.unsqueeze(1), 0.0);
        }
        out[b][h].slice(0, r0, r1).copy_(at::matmul(probabilities, vh));
      }
    }
  }
  result.fully_masked_rows = fully_masked;
  const at::Tensor host = out.contiguous().cpu();
  result.values.assign(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
  return result;
}

namespace {

const bool registered = KernelRegistry::instance().add(std::make_unique<ReferenceKernel>(
    KernelDescription{"reference-cuda",
                      "exact attention in fp64 on the GPU (fused streaming kernel; DGEMM in chunks with a mask): the reference for large calls",
                      "cuda", false},
    [](const AttentionCall& call) { return reference_attention_gpu(call); }, gpu_reference_available));

}  // namespace
}  // namespace attnreplay
