// The exact reference on a GPU, for calls too large for the CPU one: the same mathematics in fp64,
// inputs upcast. Calls with head dims up to 128 take the fused path (one streaming pass over the
// keys, cuda/reference_fused.cu, with the mask, window, softcap, ALiBi and sinks applied per
// score); wider heads take cuBLAS DGEMMs and an fp64 softmax in chunks of query rows, so that no
// s_q x s_kv matrix is ever whole. Both are checked against the CPU reference in the GPU tests.
#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <limits>
#include <numeric>

#include "formats/errors.h"
#include "formats/torch_tensor.h"
#include "kernels/device_output.h"
#include "kernels/kernel.h"
#include "kernels/reference.h"
#include "kernels/torch_inputs.h"

#ifdef ATTNREPLAY_FUSED_REFERENCE
#include "kernels/cuda/reference_fused.h"
#endif

namespace attnreplay {
namespace {

constexpr std::int64_t kScoreChunkBytes = 1ll << 30;  // one chunk of fp64 scores

at::Tensor to_gpu_fp64(const HostTensor& tensor, Layout layout) {
  return bhsd_view(device_copy(tensor, current_gpu()), layout).to(at::kDouble).contiguous();
}

// The additive mask broadcast to (b, h_q, rows, s_kv) lazily: bool masks become 0 / -inf.
at::Tensor additive_mask(const AttentionCall& call, const at::Tensor& rows) {
  at::Tensor mask = device_copy(*call.mask, current_gpu());
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

namespace {

// A call's inputs on the GPU in fp64 (bhsd; Q only at the reference's rows), as both the reference
// and the timed kernel use them.
struct GpuReferenceInputs {
  const AttentionCall* call = nullptr;
  AttentionShape shape;
  at::Tensor row_index;  // query positions of the rows computed
  at::Tensor q, k, v;
  std::optional<at::Tensor> mask;
  std::optional<at::Tensor> alibi_slopes, sinks;  // (batch, heads_q) and (heads_q) fp64, for the fused path
};

// Per (batch, query head) values on the GPU, as the call gives them for each.
at::Tensor per_head_on_gpu(const AttentionShape& s, std::int64_t batch, auto value_of) {
  std::vector<double> values;
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t h = 0; h < s.heads_q; ++h) values.push_back(value_of(b, h));
  }
  return at::tensor(values, at::TensorOptions().dtype(at::kDouble)).to(current_gpu());
}

GpuReferenceInputs upload(const AttentionCall& call, const std::vector<std::int64_t>& rows) {
  GpuReferenceInputs in;
  in.call = &call;
  in.shape = call.shape();
  const auto device = current_gpu();
  in.row_index = at::tensor(rows, at::TensorOptions().dtype(at::kLong)).to(device);
  in.q = to_gpu_fp64(call.q, call.layout);
  if (static_cast<std::int64_t>(rows.size()) != in.shape.seq_q) in.q = in.q.index_select(2, in.row_index).contiguous();
  in.k = to_gpu_fp64(call.k, call.layout);
  in.v = to_gpu_fp64(call.v, call.layout);
  if (call.mask) in.mask = additive_mask(call, in.row_index);
  if (call.alibi_slopes) {
    in.alibi_slopes = per_head_on_gpu(in.shape, in.shape.batch, [&](auto b, auto h) { return call.alibi_slope(b, h); });
  }
  if (call.sinks) in.sinks = per_head_on_gpu(in.shape, 1, [&](auto, auto h) { return call.sink(h); });
  return in;
}

// Queues the computation; `out` is (b, h_q, rows, d_vo) fp64 on the GPU. Rows with no visible key
// are counted into `fully_masked` (a one-element device tensor).
void compute(const GpuReferenceInputs& in, at::Tensor& out, at::Tensor& fully_masked) {
  const AttentionCall& call = *in.call;
  const AttentionShape& s = in.shape;
  const std::int64_t n_rows = in.row_index.size(0);
  const double scale = call.softmax_scale();
  const std::int64_t group = s.heads_q / s.heads_kv;
  const std::int64_t offset = call.diagonal_offset(s);
  fully_masked.zero_();
#ifdef ATTNREPLAY_FUSED_REFERENCE
  if (fused_reference_supports(s.head_dim_qk, s.head_dim_vo)) {
    FusedReferenceProblem problem;
    problem.q = in.q.data_ptr<double>();
    problem.k = in.k.data_ptr<double>();
    problem.v = in.v.data_ptr<double>();
    problem.out = out.data_ptr<double>();
    problem.positions = in.row_index.data_ptr<std::int64_t>();
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
    problem.fully_masked_rows = reinterpret_cast<unsigned long long*>(fully_masked.data_ptr<std::int64_t>());
    if (in.mask) {
      problem.mask = in.mask->data_ptr<double>();
      for (int dim = 0; dim < 4; ++dim) problem.mask_strides[dim] = in.mask->size(dim) == 1 ? 0 : in.mask->stride(dim);
    }
    problem.window_left_set = call.window_left.has_value();
    problem.window_left = call.window_left.value_or(0);
    problem.window_right_set = call.window_right.has_value();
    problem.window_right = call.window_right.value_or(0);
    problem.softcap = call.softcap;
    if (in.alibi_slopes) problem.alibi_slopes = in.alibi_slopes->data_ptr<double>();
    if (in.sinks) problem.sinks = in.sinks->data_ptr<double>();
    // torch's tensors above were made on the default stream, which this launch follows.
    if (const char* error = launch_fused_reference(problem, nullptr)) {
      throw std::runtime_error(std::string("GPU reference: ") + error);
    }
    return;
  }
#endif
  // Rows can be fully masked only with a mask, a window, or bottom-right causal with more queries
  // than keys.
  const bool may_mask_rows = call.mask || call.window_left || call.window_right || (call.is_causal && offset < 0);
  constexpr double kMinusInfinity = -std::numeric_limits<double>::infinity();
  const std::int64_t chunk = std::max<std::int64_t>(1, kScoreChunkBytes / (8 * s.seq_kv));
  const at::Tensor keys = at::arange(s.seq_kv, in.row_index.options()).unsqueeze(0);
  for (std::int64_t b = 0; b < s.batch; ++b) {
    for (std::int64_t h = 0; h < s.heads_q; ++h) {
      const at::Tensor kh = in.k[b][h / group];
      const at::Tensor vh = in.v[b][h / group];
      const double slope = call.alibi_slope(b, h);
      for (std::int64_t r0 = 0; r0 < n_rows; r0 += chunk) {
        const std::int64_t r1 = std::min(n_rows, r0 + chunk);
        // The same steps, in the same order, as the CPU reference (kernels/reference.cpp).
        at::Tensor scores = at::matmul(in.q[b][h].slice(0, r0, r1), kh.t()).mul_(scale);
        if (call.softcap > 0) scores = scores.div_(call.softcap).tanh_().mul_(call.softcap);
        if (in.mask) {
          const at::Tensor& m = *in.mask;
          scores.add_(m[m.size(0) == 1 ? 0 : b][m.size(1) == 1 ? 0 : h].slice(0, m.size(2) == 1 ? 0 : r0,
                                                                               m.size(2) == 1 ? 1 : r1));
        }
        const at::Tensor positions = in.row_index.slice(0, r0, r1);
        if (slope != 0) scores.sub_((positions.unsqueeze(1) + offset - keys).abs().to(at::kDouble).mul_(slope));
        if (call.is_causal || call.window_left || call.window_right) {
          scores.masked_fill_(visible_keys_mask(call, s, positions).logical_not(), kMinusInfinity);
        }
        const at::Tensor row_max = std::get<0>(scores.max(-1, /*keepdim=*/true));
        const at::Tensor empty = row_max.eq(kMinusInfinity);
        at::Tensor probabilities;
        if (call.sinks) {
          // The sink joins the denominator: exp(scores - m) / (sum + exp(sink - m)), m over both.
          const double sink = call.sink(h);
          const at::Tensor m = row_max.clamp_min(sink);
          probabilities = (scores - m).exp_();
          probabilities.div_(probabilities.sum(-1, true).add_(m.neg().add_(sink).exp_()));
        } else {
          probabilities = at::softmax(scores, -1);
        }
        if (may_mask_rows) {
          // softmax over all -inf gives NaN; such a row's output is 0, as the CPU reference gives.
          fully_masked.add_(empty.sum());
          probabilities.masked_fill_(empty, 0.0);
        }
        out[b][h].slice(0, r0, r1).copy_(at::matmul(probabilities, vh));
      }
    }
  }
}

at::Tensor empty_output(const GpuReferenceInputs& in) {
  const AttentionShape& s = in.shape;
  return at::empty({s.batch, s.heads_q, in.row_index.size(0), s.head_dim_vo}, in.q.options());
}

void download(const at::Tensor& out, const at::Tensor& fully_masked, ReferenceOutput& result) {
  result.fully_masked_rows = fully_masked.item<std::int64_t>();
  result.values.resize(static_cast<std::size_t>(out.numel()));
  at::from_blob(result.values.data(), out.sizes(), at::TensorOptions().dtype(at::kDouble)).copy_(out);
}

// The GPU reference as a timed kernel, like the other GPU kernels: inputs go up in prepare(),
// run() queues only the computation, and output() brings the result down.
class PreparedCudaReference final : public PreparedKernel, public DeviceOutput {
 public:
  explicit PreparedCudaReference(const AttentionCall& call)
      : call_(call), result_(reference_output_for(call.shape(), {})) {
    at::InferenceMode inference;
    inputs_ = upload(call_, result_.rows);
    out_ = empty_output(inputs_);
    fully_masked_ = at::zeros({1}, inputs_.row_index.options());
  }
  void run() override {
    at::InferenceMode inference;
    compute(inputs_, out_, fully_masked_);
  }
  void synchronize() override { at::detail::getCUDAHooks().deviceSynchronize(current_gpu().index()); }
  HostTensor output() override {
    at::InferenceMode inference;
    download(out_, fully_masked_, result_);
    const AttentionShape& s = result_.shape;
    return HostTensor::from_doubles(DType::float64, {s.batch, s.heads_q, s.seq_q, s.head_dim_vo}, result_.values);
  }
  at::Tensor device_output() override { return out_; }  // every row: the kernel is never sampled

 private:
  AttentionCall call_;
  ReferenceOutput result_;
  GpuReferenceInputs inputs_;
  at::Tensor out_, fully_masked_;
};

class CudaReferenceKernel final : public Kernel {
 public:
  const KernelDescription& description() const override {
    static const KernelDescription d{
        "reference-cuda",
        "exact attention in fp64 on the GPU (fp64 tensor cores, streaming; DGEMM in chunks for head dims "
        "over 128): the reference for large calls",
        "cuda", /*is_reference=*/true, std::nullopt, Extensions::all()};
    return d;
  }
  std::optional<std::string> unsupported_reason(const AttentionCall&) const override {
    if (!gpu_reference_available()) return "no CUDA device";
    return std::nullopt;
  }
  std::unique_ptr<PreparedKernel> prepare(const AttentionCall& call, const KernelOptions&) const override {
    return std::make_unique<PreparedCudaReference>(call);
  }
};

ATTNREPLAY_REGISTER_KERNEL(CudaReferenceKernel);

}  // namespace

ReferenceOutput reference_attention_gpu(const AttentionCall& call, std::vector<std::int64_t> rows, bool keep_on_device) {
  ATTNREPLAY_ASSERT(gpu_reference_available(), "GPU reference without a GPU");
  if (call.is_ragged()) {
    return reference_per_sequence(call, std::move(rows), [keep_on_device](const AttentionCall& one, std::vector<std::int64_t> r) {
      return reference_attention_gpu(one, std::move(r), keep_on_device);
    });
  }
  at::InferenceMode inference;
  ReferenceOutput result = reference_output_for(call.shape(), std::move(rows));
  const GpuReferenceInputs inputs = upload(call, result.rows);
  at::Tensor out = empty_output(inputs);
  at::Tensor fully_masked = at::zeros({1}, inputs.row_index.options());
  compute(inputs, out, fully_masked);
  if (keep_on_device) {
    result.fully_masked_rows = fully_masked.item<std::int64_t>();
    result.device_values = out;
  } else {
    download(out, fully_masked, result);
  }
  return result;
}

}  // namespace attnreplay
