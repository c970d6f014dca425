#include "kernels/cuda_attention_kernel.h"

#include <fmt/format.h>

#ifdef ATTNREPLAY_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <ATen/ATen.h>

#include "formats/mask_structure.h"
#include "formats/torch_tensor.h"
#include "kernels/cuda/cuda_attention.h"
#include "kernels/device_output.h"
#include "kernels/per_sequence.h"
#include "kernels/quantized_attention.h"
#include "kernels/torch_inputs.h"

namespace attnreplay {
namespace {

namespace cu = cuda_attention;

cu::Problem cuda_problem(const AttentionCall& call, const KernelOptions& options = {}) {
  cu::Problem p;
  p.split_keys = options.split_keys;
  p.shape = call.shape();
  p.element = call.q.dtype == DType::float16 ? cu::Element::fp16 : cu::Element::bf16;
  // A 3-dim (N, L, E) tensor is one head, the same bytes in either layout.
  p.bshd = call.layout == Layout::bshd && call.q.rank() == 4;
  // Causality from the call's visibility: its own, or a batch entry's cut to its keys.
  const MaskStructure& visible = visibility_of(call)->structure;
  p.causal = visible.upper.has_value();
  p.causal_offset = visible.upper.value_or(0);
  p.scale = call.softmax_scale();
  // Few query rows of GQA heads: run as rows of their KV head's (same bytes; no diagonal to keep).
  if (const std::optional<AttentionShape> packed = packed_query_heads(call)) {
    p.shape = *packed;
    p.packed_query_heads = true;
    p.causal = false;
    p.causal_offset = 0;
  }
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

class PreparedCudaAttention final : public PreparedKernel, public DeviceOutput, public JoinsLaunches {
 public:
  PreparedCudaAttention(const AttentionCall& call, QuantizedKind kind, const KernelOptions& options)
      : dtype_(call.q.dtype),
        shape_(call.shape()),
        attention_(kind, cuda_problem(call, options), options.quant, call.q.data(), call.k.data(), call.v.data()) {}
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
  std::unique_ptr<JointLaunch> join(const std::vector<PreparedKernel*>& calls) override {
    std::vector<cu::Attention*> attentions;
    for (PreparedKernel* call : calls) attentions.push_back(&dynamic_cast<PreparedCudaAttention&>(*call).attention_);
    return std::make_unique<Together>(attentions);
  }

 private:
  class Together final : public JointLaunch {
   public:
    explicit Together(const std::vector<cu::Attention*>& calls) : together_(calls) {}
    void run() override { together_.run(current_stream()); }

   private:
    cu::AttentionTogether together_;
  };

  DType dtype_;
  AttentionShape shape_;
  cu::Attention attention_;
};

}  // namespace

namespace {

KernelDescription gpu_kernel(const QuantizedKindSpec& spec) {
  KernelDescription description{spec.name, spec.gpu_summary, "cuda", false, spec.reduced_precision};
  description.masks = KernelDescription::Masks::diagonals;
  return description;
}

}  // namespace

CudaAttentionKernel::CudaAttentionKernel(const QuantizedKindSpec& spec) : QuantizedAttentionKernel(spec.kind, gpu_kernel(spec)) {}

std::optional<std::string> CudaAttentionKernel::unsupported_reason(const AttentionCall& call) const {
  if (auto reason = quantized_inputs_unsupported_reason(call)) return reason;
  if (std::string reason = cu::device_unsupported_reason(); !reason.empty()) return reason;
  const std::shared_ptr<const CallVisibility> visibility = visibility_of(call);
  if (call.mask) {
    // A padded batch comes a batch entry at a time (kernels/per_sequence.h), without its mask; other
    // masks their CPU emulations (<kind>-cpu) take (docs/masks.md).
    const std::string& found = visibility->mask_found;
    return "the CUDA kernels take a mask only as padding (key ranges per sequence, with causality)" +
           (found.empty() ? std::string() : "; this one is " + found);
  }
  if (visibility->structure.lower) return "the CUDA kernels take no sliding window";
  if (std::string reason = cu::problem_unsupported_reason(cuda_problem(call)); !reason.empty()) return reason;
  return std::nullopt;
}

std::unique_ptr<PreparedKernel> CudaAttentionKernel::prepare(const AttentionCall& call,
                                                             const KernelOptions& options) const {
  return std::make_unique<PreparedCudaAttention>(call, kind(), options);
}

#ifdef ATTNREPLAY_TORCH_CUDA
namespace {

// Work buffers from torch's caching allocator, on the current stream: freed as soon as the call's
// work is queued, reused only by work queued after it.
class TorchDeviceMemory final : public cu::DeviceMemory {
 public:
  void* allocate(std::size_t bytes) override { return c10::cuda::CUDACachingAllocator::raw_alloc(bytes); }
  void release(void* pointer) override { c10::cuda::CUDACachingAllocator::raw_delete(pointer); }
};

}  // namespace

at::Tensor CudaAttentionKernel::run_resident(const AttentionCall& call, const ModelInputs& inputs,
                                             const KernelOptions& options) const {
  // The kernels read (b, s, h, d) or (b, h, s, d) rows without gaps: a model's bshd tensors are
  // the first as they are (SDPA's inputs are often their transposed views), others are copied once.
  cu::Problem problem = cuda_problem(call, options);
  // Packed query heads of several rows are bhsd rows (one query row: the same bytes either way).
  const bool packed_rows = problem.packed_query_heads && call.shape().seq_q > 1;
  const bool bshd = !packed_rows && inputs.q.transpose(1, 2).is_contiguous() &&
                    inputs.k.transpose(1, 2).is_contiguous() && inputs.v.transpose(1, 2).is_contiguous();
  auto rows = [bshd](const at::Tensor& t) { return bshd ? t.transpose(1, 2) : t.contiguous(); };
  const at::Tensor q = rows(inputs.q), k = rows(inputs.k), v = rows(inputs.v);
  const c10::cuda::CUDAGuard device(q.device());
  problem.bshd = bshd;
  const AttentionShape s = call.shape();
  at::Tensor out = at::empty({s.batch, s.heads_q, s.seq_q, s.head_dim_vo}, inputs.q.options());
  TorchDeviceMemory memory;
  cu::Attention attention(kind(), problem, options.quant, {q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()},
                          memory, current_stream());
  attention.run(current_stream());
  return out;
}
#else
at::Tensor CudaAttentionKernel::run_resident(const AttentionCall&, const ModelInputs&, const KernelOptions&) const {
  throw KernelNotSupported("this build's libtorch has no CUDA");
}
#endif

namespace {

const bool gpu_kinds_registered = [] {
  for (const QuantizedKindSpec& spec : quantized_kinds()) {
    KernelRegistry::instance().add(std::make_unique<CudaAttentionKernel>(spec));
  }
  return true;
}();

}  // namespace

}  // namespace attnreplay
