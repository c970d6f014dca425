// A C++ plug-in kernel library, built as a user's would be (kernel.h only, nothing of attnreplay
// linked): straightforward attention in double, so that tests can check it is loaded, run, timed
// and judged like a built-in kernel.
#include <cmath>
#include <limits>

#include "kernels/kernel.h"
#include "tests/programs/exit_mark.h"

namespace {

using namespace attnreplay;

class NaivePrepared final : public PreparedKernel {
 public:
  explicit NaivePrepared(const AttentionCall& call)
      : shape_(call.shape()), scale_(call.softmax_scale()), call_(call),
        q_(to_bhsd(call.q, call.layout).to_doubles()), k_(to_bhsd(call.k, call.layout).to_doubles()),
        v_(to_bhsd(call.v, call.layout).to_doubles()) {}

  void run() override {
    const AttentionShape& s = shape_;
    out_.assign(static_cast<std::size_t>(s.batch * s.heads_q * s.seq_q * s.head_dim_vo), 0.0);
    const std::int64_t group = s.heads_q / s.heads_kv;
    // Bottom-right alignment moves the diagonal by the length difference.
    const std::int64_t shift =
        call_.causal_alignment == CausalAlignment::bottom_right ? s.seq_kv - s.seq_q : 0;
    std::vector<double> p(static_cast<std::size_t>(s.seq_kv));
    for (std::int64_t b = 0; b < s.batch; ++b)
      for (std::int64_t h = 0; h < s.heads_q; ++h)
        for (std::int64_t i = 0; i < s.seq_q; ++i) {
          const double* q = &q_[((b * s.heads_q + h) * s.seq_q + i) * s.head_dim_qk];
          const std::int64_t kv_head = b * s.heads_kv + h / group;
          const std::int64_t last = call_.is_causal ? std::min(s.seq_kv - 1, i + shift) : s.seq_kv - 1;
          double max = -std::numeric_limits<double>::infinity(), sum = 0;
          for (std::int64_t j = 0; j <= last; ++j) {
            const double* k = &k_[(kv_head * s.seq_kv + j) * s.head_dim_qk];
            double dot = 0;
            for (std::int64_t d = 0; d < s.head_dim_qk; ++d) dot += q[d] * k[d];
            p[j] = dot * scale_;
            max = std::max(max, p[j]);
          }
          for (std::int64_t j = 0; j <= last; ++j) sum += p[j] = std::exp(p[j] - max);
          double* o = &out_[((b * s.heads_q + h) * s.seq_q + i) * s.head_dim_vo];
          for (std::int64_t j = 0; j <= last; ++j) {
            const double* v = &v_[(kv_head * s.seq_kv + j) * s.head_dim_vo];
            for (std::int64_t d = 0; d < s.head_dim_vo; ++d) o[d] += p[j] / sum * v[d];
          }
        }
  }

  HostTensor output() override {
    return HostTensor::from_doubles(DType::float32, {shape_.batch, shape_.heads_q, shape_.seq_q, shape_.head_dim_vo},
                                    out_);
  }

 private:
  AttentionShape shape_;
  double scale_;
  AttentionCall call_;
  std::vector<double> q_, k_, v_, out_;
};

class NaiveKernel final : public Kernel {
 public:
  const KernelDescription& description() const override {
    static const KernelDescription d{"cpp-plugin-naive", "a C++ plug-in: attention in double, row by row", "cpu"};
    return d;
  }
  std::optional<std::string> unsupported_reason(const AttentionCall& call) const override {
    if (call.mask) return "masks are not supported by this plug-in";
    return std::nullopt;
  }
  std::unique_ptr<PreparedKernel> prepare(const AttentionCall& call, const KernelOptions&) const override {
    return std::make_unique<NaivePrepared>(call);
  }
};

ATTNREPLAY_REGISTER_KERNEL(NaiveKernel);

// As a user's library may write what it gathered when the process ends (tests/e2e/test_plugins.py).
WritesAtExit writes_at_exit;

}  // namespace
