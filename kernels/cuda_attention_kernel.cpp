#include "kernels/cuda_attention_kernel.h"

#include <fmt/format.h>

#ifdef ATTNREPLAY_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <ATen/ATen.h>

#include "formats/torch_tensor.h"
#include "kernels/cuda/cuda_attention.h"
#include "kernels/device_output.h"
#include "kernels/torch_inputs.h"

namespace attnreplay {
namespace {

namespace cu = cuda_attention;

cu::Kind cuda_kind(QuantizedKind kind) {
  switch (kind) {
    case QuantizedKind::flash: return cu::Kind::flash;
    case QuantizedKind::sage1_int8: return cu::Kind::sage1_int8;
    case QuantizedKind::sage2_int8_fp8: return cu::Kind::sage2_int8_fp8;
    case QuantizedKind::fa3_fp8: return cu::Kind::fa3_fp8;
  }
  return cu::Kind::flash;
}

cu::Options cuda_options(const QuantOptions& options) {
  cu::Options out;
  switch (options.quant_gran) {
    case QuantGranularity::per_block: out.granularity = cu::Granularity::per_block; break;
    case QuantGranularity::per_warp: out.granularity = cu::Granularity::per_warp; break;
    case QuantGranularity::per_thread: out.granularity = cu::Granularity::per_thread; break;
  }
  out.k_smooth = options.k_smooth;
  switch (options.pv_accum) {
    case PvAccum::fp32: out.pv_accumulation = cu::PvAccumulation::fp32; break;
    case PvAccum::fp32_fp32: out.pv_accumulation = cu::PvAccumulation::fp32_fp32; break;
    case PvAccum::fp32_fp16: out.pv_accumulation = cu::PvAccumulation::fp32_fp16; break;
  }
  out.fp8_scale = options.fp8_scale == Fp8Scale::per_tensor ? cu::Fp8ScaleGranularity::per_tensor
                                                            : cu::Fp8ScaleGranularity::per_head;
  return out;
}

cu::Problem cuda_problem(const AttentionCall& call) {
  const AttentionShape s = call.shape();
  cu::Problem p;
  p.batch = s.batch;
  p.heads_q = s.heads_q;
  p.heads_kv = s.heads_kv;
  p.seq_q = s.seq_q;
  p.seq_kv = s.seq_kv;
  p.head_dim = s.head_dim_qk;
  p.element = call.q.dtype == DType::float16 ? cu::Element::fp16 : cu::Element::bf16;
  // A 3-dim (N, L, E) tensor is one head, the same bytes in either layout.
  p.bshd = call.layout == Layout::bshd && call.q.rank() == 4;
  p.causal = call.is_causal;
  p.bottom_right = call.causal_alignment == CausalAlignment::bottom_right;
  p.scale = call.softmax_scale();
  return p;
}

// Work goes on torch's current stream, as torch's own kernels' does, so that a CUDA graph capture
// on a side stream records it; outside a capture that is the default stream.
cudaStream_t current_stream() {
#ifdef ATTNREPLAY_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream().stream();
#else
  return nullptr;
#endif
}

class PreparedCudaAttention final : public PreparedKernel, public DeviceOutput {
 public:
  PreparedCudaAttention(const AttentionCall& call, QuantizedKind kind, const QuantOptions& options)
      : dtype_(call.q.dtype),
        shape_(call.shape()),
        attention_(cuda_kind(kind), cuda_problem(call), cuda_options(options), call.q.data(), call.k.data(),
                   call.v.data()) {}
  bool has_preparation() const override { return attention_.has_preparation(); }
  void prepare_inputs() override { attention_.prepare_inputs(current_stream()); }
  double preparation_bytes() const override { return static_cast<double>(attention_.preparation_bytes()); }
  void run() override { attention_.run(current_stream()); }
#ifdef ATTNREPLAY_TORCH_CUDA
  bool runs_on_current_stream() const override { return true; }
#endif
  void synchronize() override { attention_.synchronize(); }
  HostTensor output() override {
    attention_.synchronize();
    HostTensor out = HostTensor::allocate(dtype_, {shape_.batch, shape_.heads_q, shape_.seq_q, shape_.head_dim_vo});
    attention_.download_output(out.mutable_data(), out.nbytes());
    return out;
  }
  at::Tensor device_output() override {
    attention_.synchronize();
    return at::from_blob(const_cast<void*>(attention_.device_output()),
                         {shape_.batch, shape_.heads_q, shape_.seq_q, shape_.head_dim_vo},
                         at::TensorOptions().dtype(torch_scalar_type(dtype_)).device(current_gpu()));
  }

 private:
  DType dtype_;
  AttentionShape shape_;
  cu::Attention attention_;
};

}  // namespace

std::optional<std::string> CudaAttentionKernel::unsupported_reason(const AttentionCall& call) const {
  if (auto reason = quantized_inputs_unsupported_reason(call)) return reason;
  if (call.mask) return "masks other than causal are not supported";
  if (std::string reason = cu::problem_unsupported_reason(cuda_problem(call)); !reason.empty()) return reason;
  if (std::string reason = cu::device_unsupported_reason(); !reason.empty()) return reason;
  return std::nullopt;
}

std::unique_ptr<PreparedKernel> CudaAttentionKernel::prepare(const AttentionCall& call) const {
  return std::make_unique<PreparedCudaAttention>(call, kind(), quant_options());
}

}  // namespace attnreplay
