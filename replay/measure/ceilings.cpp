#include "replay/measure/ceilings.h"

#include <cmath>

#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <fmt/format.h>

#include <functional>

#include "kernels/torch_inputs.h"
#include "replay/measure/timers.h"

namespace attnreplay {
namespace {

class Lambda final : public PreparedKernel {
 public:
  explicit Lambda(std::function<void()> body) : body_(std::move(body)) {}
  void run() override { body_(); }
  HostTensor output() override { return {}; }

 private:
  std::function<void()> body_;
};

// Median seconds of `body`, hot L2 (these are rates of the units, not of cold memory).
double median_seconds(const std::function<void()>& body) {
  auto timer = make_cuda_timer(CudaTimerOptions{/*cold_l2=*/false});
  Lambda kernel(body);
  // The default rule, shortened: a start-up that costs a fraction of a second. A matrix unit's rate
  // is steady, so the median is known to 0.5 % after a few dozen runs.
  StoppingRule rule = StoppingRule::gpu_default();
  rule.min_time_s = 0.02;
  rule.timeout_s = 1;
  return measure(kernel, *timer, rule).median_s;
}

// A rate whose timing kept no sample (a throttled GPU) is NaN: 0, "not measured", as Ceilings says.
double measured_or_zero(double rate) { return std::isfinite(rate) ? rate : 0.0; }

}  // namespace

Ceilings measure_ceilings() {
  Ceilings c;
  if (!at::detail::getCUDAHooks().hasCUDA()) return c;
  at::InferenceMode inference;
  const std::int64_t n = 8192;
  const double flops = 2.0 * n * n * n;
  const auto cuda = at::TensorOptions().device(current_gpu());
  try {
    // Random data: products of zeros run faster than real ones.
    const at::Tensor a = at::randn({n, n}, cuda.dtype(at::kBFloat16)), b = at::randn({n, n}, cuda.dtype(at::kBFloat16));
    c.bf16_tflops = measured_or_zero(flops / median_seconds([&] { at::matmul(a, b); }) / 1e12);
  } catch (const std::exception&) {
  }
  try {
    const at::Tensor a = at::randn({n, n}, cuda).to(at::kFloat8_e4m3fn);
    const at::Tensor b = at::randn({n, n}, cuda).to(at::kFloat8_e4m3fn);
    const at::Tensor one = at::ones({}, cuda.dtype(at::kFloat));
    c.fp8_tflops = measured_or_zero(flops / median_seconds([&] { at::_scaled_mm(a, b.t(), one, one, std::nullopt, std::nullopt, at::kBFloat16); }) / 1e12);
  } catch (const std::exception&) {
  }
  try {
    const at::Tensor a = at::randint(-128, 127, {n, n}, cuda.dtype(at::kChar));
    const at::Tensor b = at::randint(-128, 127, {n, n}, cuda.dtype(at::kChar));
    c.int8_tops = measured_or_zero(flops / median_seconds([&] { at::_int_mm(a, b.t()); }) / 1e12);
  } catch (const std::exception&) {
  }
  try {
    const std::int64_t bytes = 1ll << 30;
    const at::Tensor src = at::randn({bytes / 4}, cuda.dtype(at::kFloat));
    at::Tensor dst = at::empty_like(src);
    c.copy_gbps = measured_or_zero(2.0 * static_cast<double>(bytes) / median_seconds([&] { dst.copy_(src); }) / 1e9);
  } catch (const std::exception&) {
  }
  return c;
}

}  // namespace attnreplay
