// The example's kernel as attnreplay sees it: what it takes, its inputs uploaded once (converted
// to fp32, the preparation), and run() launching the kernel alone, so that is what is timed.
#include <cuda_runtime.h>

#include <stdexcept>
#include <vector>

#include "kernels/kernel.h"
#include "tiled_attention.h"

namespace {

using namespace attnreplay;

void check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(error));
}

float* upload(const HostTensor& tensor, Layout layout) {
  const std::vector<double> values = to_bhsd(tensor, layout).to_doubles();
  const std::vector<float> floats(values.begin(), values.end());
  float* device = nullptr;
  check(cudaMalloc(&device, floats.size() * sizeof(float)), "cudaMalloc");
  check(cudaMemcpy(device, floats.data(), floats.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  return device;
}

class TiledPrepared final : public PreparedKernel {
 public:
  explicit TiledPrepared(const AttentionCall& call) {
    const AttentionShape s = call.shape();
    problem_ = {upload(call.q, call.layout), upload(call.k, call.layout), upload(call.v, call.layout), nullptr,
                s.batch, s.heads_q, s.heads_kv, s.seq_q, s.seq_kv, s.head_dim_qk, s.head_dim_vo,
                static_cast<float>(call.softmax_scale()), call.is_causal,
                call.causal_alignment == CausalAlignment::bottom_right ? s.seq_kv - s.seq_q : 0};
    out_elements_ = s.batch * s.heads_q * s.seq_q * s.head_dim_vo;
    check(cudaMalloc(&problem_.out, out_elements_ * sizeof(float)), "cudaMalloc");
  }
  ~TiledPrepared() override {
    for (const float* p : {problem_.q, problem_.k, problem_.v, static_cast<const float*>(problem_.out)}) {
      cudaFree(const_cast<float*>(p));
    }
  }
  void run() override {
    const std::string error = launch_tiled_attention(problem_);
    if (!error.empty()) throw std::runtime_error(error);
  }
  void synchronize() override { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
  HostTensor output() override {
    std::vector<float> host(out_elements_);
    check(cudaMemcpy(host.data(), problem_.out, host.size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    const std::vector<double> values(host.begin(), host.end());
    return HostTensor::from_doubles(DType::float32, {problem_.batch, problem_.heads_q, problem_.seq_q, problem_.dim_vo},
                                    values);
  }

 private:
  TiledAttentionProblem problem_{};
  std::int64_t out_elements_ = 0;
};

class TiledKernel final : public Kernel {
 public:
  const KernelDescription& description() const override {
    static const KernelDescription d{"cuda-tiled", "example CUDA plug-in: one thread per query row, fp32", "cuda"};
    return d;
  }
  std::optional<std::string> unsupported_reason(const AttentionCall& call) const override {
    if (std::string problem = cuda_device_problem(); !problem.empty()) return problem;
    if (call.mask) return "masks are not supported by this example";
    const AttentionShape s = call.shape();
    if (s.head_dim_qk > 256 || s.head_dim_vo > 256) return "head dims above 256 are not supported";
    return std::nullopt;
  }
  std::unique_ptr<PreparedKernel> prepare(const AttentionCall& call, const KernelOptions&) const override {
    return std::make_unique<TiledPrepared>(call);
  }
};

ATTNREPLAY_REGISTER_KERNEL(TiledKernel);

}  // namespace
