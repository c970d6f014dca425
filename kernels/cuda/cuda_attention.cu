// One call on the GPU (kernels/cuda/cuda_attention.h): its buffers, the input preparation of each
// kind, the launch, and the checks of whether this device and build can run a kind at all.
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/cuda_attention.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/quantize.h"

#ifndef ATTNREPLAY_CUDA_ARCHITECTURES
#define ATTNREPLAY_CUDA_ARCHITECTURES "unknown"
#endif

namespace attnreplay::cuda_attention {
namespace {

// Compiled for the same architectures as every kernel here: whether the device can load it says
// whether it can load them.
__global__ void probe_kernel() {}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { free(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // From `memory`, or cudaMalloc where it is null.
  void allocate(DeviceMemory* memory, std::size_t bytes, const std::string& what) {
    free();
    memory_ = memory;
    if (memory_) {
      pointer_ = bytes > 0 ? memory_->allocate(bytes) : nullptr;
      bytes_ = bytes;
      return;
    }
    const cudaError_t status = cudaMalloc(&pointer_, bytes);
    if (status != cudaSuccess) {
      pointer_ = nullptr;
      cudaGetLastError();  // out of memory is not sticky: clear it for the kernels that follow
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": cudaMalloc of " + what +
                               " (" + std::to_string(bytes) + " bytes): " + cudaGetErrorName(status) + ": " +
                               cudaGetErrorString(status));
    }
    bytes_ = bytes;
  }
  // For work the kernels leave as they found it (counters, maxima): zeroed once, here.
  void allocate_zeroed(DeviceMemory* memory, std::size_t bytes, const std::string& what, cudaStream_t stream) {
    allocate(memory, bytes, what);
    ATTNREPLAY_CUDA_CHECK(cudaMemsetAsync(pointer_, 0, bytes, stream));
  }
  // Memory someone else owns (a model's tensor), used as it is and never freed here.
  void borrow(const void* pointer, std::size_t bytes) {
    free();
    pointer_ = const_cast<void*>(pointer);
    bytes_ = bytes;
    borrowed_ = true;
  }
  template <typename T = void>
  T* as() const {
    return static_cast<T*>(pointer_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  void free() {
    if (pointer_ && !borrowed_) {
      if (memory_) memory_->release(pointer_);
      else cudaFree(pointer_);
    }
    pointer_ = nullptr;
    bytes_ = 0;
    memory_ = nullptr;
    borrowed_ = false;
  }
  void* pointer_ = nullptr;
  std::size_t bytes_ = 0;
  DeviceMemory* memory_ = nullptr;
  bool borrowed_ = false;
};

std::string capability_of(const cudaDeviceProp& properties) {
  return std::to_string(properties.major) + "." + std::to_string(properties.minor);
}

}  // namespace

std::string device_unsupported_reason() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return "no CUDA device";
  }
  int device = 0;
  cudaDeviceProp properties{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&properties, device) != cudaSuccess) {
    cudaGetLastError();
    return "cannot query the CUDA device";
  }
  // Every kind is written for Hopper's warpgroup MMA, whose sm_90a code runs on 9.0 alone.
  if (properties.major * 10 + properties.minor != 90) {
    return "the kernels use Hopper's warpgroup MMA (sm_90a), for compute capability 9.0; " +
           std::string(properties.name) + " has " + capability_of(properties);
  }
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, probe_kernel) != cudaSuccess) {
    cudaGetLastError();
    return "this build has no code for compute capability " + capability_of(properties) +
           " (CUDA architectures: " ATTNREPLAY_CUDA_ARCHITECTURES ")";
  }
  return "";
}

std::string problem_unsupported_reason(const Problem& p) {
  for (const std::int64_t dim : {p.shape.head_dim_qk, p.shape.head_dim_vo}) {
    if (dim <= 0 || dim > 128 || dim % 8 != 0) {
      return "head dim " + std::to_string(dim) + ": the CUDA kernels take multiples of 8 up to 128 (64 and 128 as they are, others padded)";
    }
  }
  constexpr std::int64_t kGridLimit = 65535;  // grid y (heads) and z (batch)
  if (p.shape.heads_q > kGridLimit || p.shape.batch > kGridLimit) {
    return "more than 65535 heads or batch entries (" + std::to_string(p.shape.heads_q) + ", " + std::to_string(p.shape.batch) + ")";
  }
  if (p.shape.heads_kv <= 0 || p.shape.heads_q % p.shape.heads_kv != 0) return "heads_q must be a multiple of heads_kv";
  if (ceil_div(p.shape.seq_q, kBlockQ) > std::numeric_limits<int>::max()) return "seq_q too long for the grid";
  return "";
}

namespace {

// The head dim the kernels run a problem at: 64 where both of its own fit, else 128.
std::int64_t kernel_head_dim(const AttentionShape& shape) {
  return shape.head_dim_qk <= 64 && shape.head_dim_vo <= 64 ? 64 : 128;
}

// Where the call's head dims are not the kernels', the problem the kernels run: both padded, bhsd.
Problem as_run(const Problem& given) {
  Problem run = given;
  const std::int64_t d = kernel_head_dim(given.shape);
  if (d == given.shape.head_dim_qk && d == given.shape.head_dim_vo) return run;
  run.shape.head_dim_qk = run.shape.head_dim_vo = d;
  run.bshd = false;
  return run;
}

}  // namespace

struct Attention::State {
  QuantizedKind kind = QuantizedKind::flash;
  // As the kernels run it: where the call's head dims are not the kernels' (`padded`), both padded
  // to kernel_head_dim and the inputs bhsd; else the call's.
  Problem p;
  Problem given;  // the call's
  bool padded = false;
  QuantOptions options;
  DeviceBuffer q_given, k_given, v_given;  // padded: the inputs as uploaded or borrowed
  DeviceBuffer q_in, k_in, v_in;        // as uploaded, in the call's layout; padded: with zero channels, bhsd
  DeviceBuffer q_work, k_work, v_work;  // what the attention reads, when not the uploads
  DeviceBuffer q_scale, k_scale, v_scale, k_mean;
  DeviceBuffer k_mean_work;  // block sums and counters of channel_means or K's head groups, zeroed once
  DeviceBuffer amax;  // the FP8 maxima of every input, zeroed at once (two-pass FP8 only)
  DeviceBuffer fp8_heads_work;  // where quantize_fp8_heads' groups meet, zeroed once (heads past a cluster)
  bool fp8_one_read = false;  // FP8 codes by quantize_fp8_heads, where the heads fit a cluster or group
  bool k_one_read = false;    // K's means and INT8 codes by quantize_int8_key_heads, likewise
  bool v_first = false;       // sage2's V heads (one read) in a launch of their own, before K's
  DeviceBuffer out;
  AttentionArgs args;
  Order attention_order = Order::after_all;  // overlapping right after prepare_inputs
  DeviceMemory* memory = nullptr;  // where work buffers come from (null: cudaMalloc)

  // The keys split across CTAs where the call alone would leave most SMs idle (a decode step of
  // one sequence): planned at the first run, each split a part of one launch (grid z), its rows
  // combined after it.
  struct KeySplits {
    bool planned = false;
    int count = 0;  // 0: not split
    DeviceBuffer rows, lse, parts;
  } splits;

  // The call's problem, and the one the kernels run, set once.
  void take_problem(const Problem& call) {
    given = call;
    p = as_run(call);
    padded = !(p.shape == call.shape);
  }

  static InputView view(const Problem& problem, const DeviceBuffer& buffer, std::int64_t heads, std::int64_t seq,
                        std::int64_t d, bool query = false) {
    InputView v;
    v.data = buffer.as();
    if (problem.bshd && !(query && problem.packed_query_heads)) v.stride_b = seq * heads * d, v.stride_h = d, v.stride_s = heads * d;
    else v.stride_b = heads * seq * d, v.stride_h = seq * d, v.stride_s = d;
    v.batch = static_cast<int>(problem.shape.batch);
    v.heads = static_cast<int>(heads);
    v.seq = seq;
    v.head_dim = static_cast<int>(d);
    v.element = problem.element;
    return v;
  }
  // What the preparation reads, as the kernels run the problem.
  InputView q_view() const { return view(p, q_in, p.shape.heads_q, p.shape.seq_q, p.shape.head_dim_qk, true); }
  InputView k_view() const { return view(p, k_in, p.shape.heads_kv, p.shape.seq_kv, p.shape.head_dim_qk); }
  InputView v_view() const { return view(p, v_in, p.shape.heads_kv, p.shape.seq_kv, p.shape.head_dim_vo); }
};

namespace {

// Bytes of Q, K, V and the output, in the 2-byte element types.
struct InputBytes {
  std::size_t q = 0, k = 0, v = 0, out = 0;
};
InputBytes input_bytes(const Problem& p) {
  const AttentionShape& s = p.shape;
  const auto rows_q = static_cast<std::size_t>(s.batch * s.heads_q * s.seq_q);
  const auto rows_kv = static_cast<std::size_t>(s.batch * s.heads_kv * s.seq_kv);
  const auto d_qk = static_cast<std::size_t>(s.head_dim_qk), d_vo = static_cast<std::size_t>(s.head_dim_vo);
  return {rows_q * d_qk * 2, rows_kv * d_qk * 2, rows_kv * d_vo * 2, rows_q * d_vo * 2};
}

}  // namespace

Attention::Attention(QuantizedKind kind, const Problem& p, const QuantOptions& options, const void* q, const void* k,
                     const void* v)
    : state_(std::make_unique<State>()) {
  if (const std::string reason = problem_unsupported_reason(p); !reason.empty()) throw std::invalid_argument(reason);
  State& s = *state_;
  s.take_problem(p);
  const InputBytes bytes = input_bytes(p);
  DeviceBuffer& q_upload = s.padded ? s.q_given : s.q_in;
  DeviceBuffer& k_upload = s.padded ? s.k_given : s.k_in;
  DeviceBuffer& v_upload = s.padded ? s.v_given : s.v_in;
  q_upload.allocate(nullptr, bytes.q, "Q");
  k_upload.allocate(nullptr, bytes.k, "K");
  v_upload.allocate(nullptr, bytes.v, "V");
  ATTNREPLAY_CUDA_CHECK(cudaMemcpy(q_upload.as(), q, q_upload.bytes(), cudaMemcpyHostToDevice));
  ATTNREPLAY_CUDA_CHECK(cudaMemcpy(k_upload.as(), k, k_upload.bytes(), cudaMemcpyHostToDevice));
  ATTNREPLAY_CUDA_CHECK(cudaMemcpy(v_upload.as(), v, v_upload.bytes(), cudaMemcpyHostToDevice));
  s.out.allocate(nullptr, bytes.out, "the output");
  set_up(kind, options, nullptr, nullptr);
  synchronize();
}

Attention::Attention(QuantizedKind kind, const Problem& p, const QuantOptions& options, const ResidentInputs& inputs,
                     DeviceMemory& memory, cudaStream_t stream)
    : state_(std::make_unique<State>()) {
  if (const std::string reason = problem_unsupported_reason(p); !reason.empty()) throw std::invalid_argument(reason);
  State& s = *state_;
  s.take_problem(p);
  const InputBytes bytes = input_bytes(p);
  (s.padded ? s.q_given : s.q_in).borrow(inputs.q, bytes.q);
  (s.padded ? s.k_given : s.k_in).borrow(inputs.k, bytes.k);
  (s.padded ? s.v_given : s.v_in).borrow(inputs.v, bytes.v);
  s.out.borrow(inputs.out, bytes.out);
  set_up(kind, options, &memory, stream);
}

// The work buffers of `kind` for the problem taken (from `memory`, or cudaMalloc where null) and the
// input preparation, queued on `stream`.
void Attention::set_up(QuantizedKind kind, const QuantOptions& options, DeviceMemory* memory, cudaStream_t stream) {
  State& s = *state_;
  s.kind = kind;
  s.options = options;
  s.memory = memory;
  const Problem& p = s.p;
  const std::size_t d = static_cast<std::size_t>(p.shape.head_dim_qk);
  if (s.padded) {  // the inputs with zero channels up to the kernels' head dim, filled by prepare_inputs
    const InputBytes bytes = input_bytes(p);
    s.q_in.allocate(memory, bytes.q, "Q (padded)");
    s.k_in.allocate(memory, bytes.k, "K (padded)");
    s.v_in.allocate(memory, bytes.v, "V (padded)");
  }

  AttentionArgs& a = s.args;
  a.out = s.out.as();
  a.out_dim = static_cast<int>(s.given.shape.head_dim_vo);
  a.seq_q = p.shape.seq_q;
  a.seq_kv = p.shape.seq_kv;
  a.heads_q = static_cast<int>(p.shape.heads_q);
  a.heads_kv = static_cast<int>(p.shape.heads_kv);
  a.batch = static_cast<int>(p.shape.batch);
  a.head_dim = static_cast<int>(p.shape.head_dim_qk);
  a.element = p.element;
  a.granularity = options.quant_gran;
  a.pv_accumulation = options.pv_accum;
  // In fp32 as the emulation has it: float(scale) * float(log2 e).
  a.score_scale = static_cast<float>(p.scale) * 1.4426950408889634f;
  a.causal = p.causal;
  a.causal_offset = p.causal ? p.causal_offset : 0;

  const std::int64_t q_rows = ceil_div(p.shape.seq_q, kBlockQ) * kBlockQ;  // padded, quantized kinds
  const std::int64_t k_rows = ceil_div(p.shape.seq_kv, kBlockK) * kBlockK;
  const std::size_t bq = static_cast<std::size_t>(p.shape.batch * p.shape.heads_q);
  const std::size_t bkv = static_cast<std::size_t>(p.shape.batch * p.shape.heads_kv);
  switch (kind) {
    case QuantizedKind::flash:
      a.q_rows = p.shape.seq_q, a.k_rows = p.shape.seq_kv, a.v_length = p.shape.seq_kv;
      if (p.bshd) {
        s.q_work.allocate(memory, s.q_in.bytes(), "Q (bhsd)");
        s.k_work.allocate(memory, s.k_in.bytes(), "K (bhsd)");
        s.v_work.allocate(memory, s.v_in.bytes(), "V (bhsd)");
        a.q = s.q_work.as(), a.k = s.k_work.as(), a.v = s.v_work.as();
      } else {
        a.q = s.q_in.as(), a.k = s.k_in.as(), a.v = s.v_in.as();
      }
      break;
    case QuantizedKind::sage1_int8:
    case QuantizedKind::sage2_int8_fp8: {
      a.q_rows = q_rows, a.k_rows = k_rows;
      a.k_groups = k_rows / kBlockK * int8_groups_per_block(true, options.quant_gran);
      s.k_work.allocate(memory, bkv * static_cast<std::size_t>(k_rows) * d, "K codes");
      s.k_scale.allocate(memory, bkv * static_cast<std::size_t>(a.k_groups) * sizeof(float), "K scales");
      if (kind == QuantizedKind::sage1_int8) {
        a.q_groups = q_rows / kBlockQ * int8_groups_per_block(false, options.quant_gran);
        s.q_work.allocate(memory, bq * static_cast<std::size_t>(q_rows) * d, "Q codes");
        s.q_scale.allocate(memory, bq * static_cast<std::size_t>(a.q_groups) * sizeof(float), "Q scales");
        a.q = s.q_work.as(), a.q_scale = s.q_scale.as<float>();
      } else {  // the attention kernel quantizes Q as uploaded
        const InputView q = s.q_view();
        a.q = s.q_in.as(), a.q_stride_s = q.stride_s, a.q_stride_h = q.stride_h, a.q_stride_b = q.stride_b;
      }
      s.k_one_read = options.k_smooth && p.shape.seq_kv > 0 && int8_key_heads_fit(k_rows, s.k_view());
      if (s.k_one_read) {
        if (const std::size_t bytes = int8_key_heads_work_bytes(k_rows, s.k_view()); bytes > 0) {
          s.k_mean_work.allocate_zeroed(memory, bytes, "K block sums", stream);
        }
      } else if (options.k_smooth) {
        s.k_mean.allocate(memory, bkv * d * sizeof(float), "K channel means");
        s.k_mean_work.allocate_zeroed(memory, channel_means_work_bytes(s.k_view()), "K block sums", stream);
      }
      a.k = s.k_work.as(), a.k_scale = s.k_scale.as<float>();
      if (kind == QuantizedKind::sage1_int8) {
        a.v_length = p.shape.seq_kv;
        if (p.bshd) s.v_work.allocate(memory, s.v_in.bytes(), "V (bhsd)");
        a.v = p.bshd ? s.v_work.as() : s.v_in.as();
      } else {
        a.v_length = k_rows;
        s.v_work.allocate(memory, bkv * d * static_cast<std::size_t>(k_rows), "V (e4m3)");
        s.fp8_one_read = fp8_heads_fit(k_rows, s.v_view());
        if (!s.fp8_one_read) {
          s.amax.allocate(memory, bkv * d * sizeof(unsigned), "V amax");
        } else {
          // V first, the next launch filling the SMs that V's last wave leaves idle: where K's heads
          // are not held by clusters or groups of their own (8 % off sage2's preparation at Flux
          // when K took two passes there, H100), and where K's heads are held by groups but V's fit
          // a cluster (2.5 % at Flux and 4x32x4096x128). Else V's heads wait on K's: after K's
          // clusters (V first was 5 % slower at 4x32x1024x128), or inside K's group launch where V
          // needs groups too (V first was 3 % slower at 4x32x16384x128).
          const bool key_groups = s.k_one_read && s.k_mean_work.bytes() > 0;
          const std::size_t own_launch_bytes = fp8_heads_work_bytes(k_rows, s.v_view(), bkv);
          s.v_first = !s.k_one_read || (key_groups && own_launch_bytes == 0);
          const std::size_t bytes = key_groups && !s.v_first ? int8_key_heads_values_work_bytes(s.v_view())
                                                             : own_launch_bytes;
          if (bytes > 0) s.fp8_heads_work.allocate_zeroed(memory, bytes, "FP8 head groups", stream);
        }
        s.v_scale.allocate(memory, bkv * d * sizeof(float), "V scales");
        a.v = s.v_work.as();
        a.v_scale = s.v_scale.as<float>();
      }
      break;
    }
    case QuantizedKind::fa3_fp8:
      a.q_rows = q_rows, a.k_rows = k_rows, a.v_length = k_rows;
      s.q_work.allocate(memory, bq * static_cast<std::size_t>(q_rows) * d, "Q (e4m3)");
      s.k_work.allocate(memory, bkv * static_cast<std::size_t>(k_rows) * d, "K (e4m3)");
      s.v_work.allocate(memory, bkv * d * static_cast<std::size_t>(k_rows), "V (e4m3)");
      s.fp8_one_read = options.fp8_scale == Fp8Scale::per_head &&
                       fp8_heads_fit(std::max(q_rows, k_rows), s.q_view());
      if (!s.fp8_one_read) {
        s.amax.allocate(memory, (bq + 2 * bkv) * sizeof(unsigned), "Q, K and V amax");
      } else if (const std::size_t bytes = fp8_heads_work_bytes(std::max(q_rows, k_rows), s.q_view(), bq + 2 * bkv);
                 bytes > 0) {
        s.fp8_heads_work.allocate_zeroed(memory, bytes, "FP8 head groups", stream);
      }
      s.q_scale.allocate(memory, bq * sizeof(float), "Q scales");
      s.k_scale.allocate(memory, bkv * sizeof(float), "K scales");
      s.v_scale.allocate(memory, bkv * sizeof(float), "V scales");
      a.q = s.q_work.as(), a.k = s.k_work.as(), a.v = s.v_work.as();
      a.q_scale = s.q_scale.as<float>(), a.k_scale = s.k_scale.as<float>(), a.v_scale = s.v_scale.as<float>();
      break;
  }
  prepare_inputs(stream);
}

Attention::~Attention() = default;

bool Attention::has_preparation() const {
  return state_->kind != QuantizedKind::flash || state_->p.bshd || state_->padded;
}

std::size_t Attention::preparation_bytes() const {
  const State& s = *state_;
  if (!has_preparation()) return 0;
  // A work buffer exists for each input the preparation makes; V stays as uploaded for sage1 on
  // bhsd inputs. Intermediate maxima (a few bytes a head) are left out.
  std::size_t read = 0, written = 0;
  // Padding reads the inputs as given and writes them with their zero channels.
  if (s.padded) {
    read += s.q_given.bytes() + s.k_given.bytes() + s.v_given.bytes();
    written += s.q_in.bytes() + s.k_in.bytes() + s.v_in.bytes();
  }
  for (const auto& [in, work] : {std::pair{&s.q_in, &s.q_work}, {&s.k_in, &s.k_work}, {&s.v_in, &s.v_work}}) {
    if (work->bytes() > 0) read += in->bytes(), written += work->bytes();
  }
  if (s.k_mean.bytes() > 0) read += s.k_in.bytes();  // K again, for means that take a pass of their own
  written += s.q_scale.bytes() + s.k_scale.bytes() + s.v_scale.bytes() + s.k_mean.bytes();
  return read + written;
}

void Attention::prepare_inputs(cudaStream_t stream) {
  State& s = *state_;
  const AttentionArgs& a = s.args;
  // The first kernel waits for all work before it (the previous call's attention reads what it
  // writes); each later one overlaps the last wave of the one before (device_utils.cuh).
  Order order = Order::after_all;
  auto next = [&order] { return std::exchange(order, Order::overlapping); };
  if (s.padded) {
    const AttentionShape& given = s.given.shape;
    const int d = static_cast<int>(s.p.shape.head_dim_qk);
    copy_to_bhsd(State::view(s.given, s.q_given, given.heads_q, given.seq_q, given.head_dim_qk, true), s.q_in.as(),
                 next(), stream, d);
    copy_to_bhsd(State::view(s.given, s.k_given, given.heads_kv, given.seq_kv, given.head_dim_qk), s.k_in.as(), next(),
                 stream, d);
    copy_to_bhsd(State::view(s.given, s.v_given, given.heads_kv, given.seq_kv, given.head_dim_vo), s.v_in.as(), next(),
                 stream, d);
    // The kernels below read "the uploaded inputs" without waiting for the kernel before them,
    // and these are now the copies' outputs: the next starts once the copies are done.
    order = Order::after_all;
  }
  switch (s.kind) {
    case QuantizedKind::flash:
      if (s.p.bshd) {
        copy_to_bhsd(s.q_view(), s.q_work.as(), next(), stream);
        copy_to_bhsd(s.k_view(), s.k_work.as(), next(), stream);
        copy_to_bhsd(s.v_view(), s.v_work.as(), next(), stream);
      }
      break;
    case QuantizedKind::sage1_int8:
    case QuantizedKind::sage2_int8_fp8: {
      const bool sage2 = s.kind == QuantizedKind::sage2_int8_fp8;
      // Under fp32+fp16, V's amax maps to 2.25 rather than 448: a 32-key chunk of P·V then stays
      // inside fp16's range (docs/quantized.md).
      const float v_target = s.options.pv_accum == PvAccum::fp32_fp16 ? 2.25f : 448.0f;
      auto quantize_v_one_read = [&] {
        quantize_fp8_heads({{s.v_view(), true, true, v_target, s.v_scale.as<float>(), s.v_work.as<std::uint8_t>(),
                             a.v_length}},
                           s.fp8_heads_work.as(), next(), stream);
      };
      const bool v_first = sage2 && s.v_first;  // the constructor says why
      bool v_done = false;  // by K's groups' launch
      if (v_first) quantize_v_one_read();
      // sage2's V maxima, in two passes: beside K's means where they take a pass of their own (one
      // launch fewer), else alone.
      const bool v_two_pass = sage2 && !s.fp8_one_read;
      const MaxTarget v_maxima{s.v_view(), v_two_pass ? s.amax.as<unsigned>() : nullptr};
      if (v_two_pass) ATTNREPLAY_CUDA_CHECK(cudaMemsetAsync(s.amax.as(), 0, s.amax.bytes(), stream));
      const float* mean = nullptr;
      if (s.k_mean.bytes() > 0) {
        channel_means(s.k_view(), s.k_mean.as<float>(), s.k_mean_work.as(), v_maxima, next(), stream);
        mean = s.k_mean.as<float>();
      } else if (v_two_pass) {
        abs_max({v_maxima}, true, false, next(), stream);
      }
      const Int8Target q{s.q_view(), false, a.score_scale, nullptr,
                         {s.q_work.as<std::int8_t>(), a.q_rows, s.q_scale.as<float>(), a.q_groups}};
      const Int8Target k{s.k_view(), true, 1.0f, mean,
                         {s.k_work.as<std::int8_t>(), a.k_rows, s.k_scale.as<float>(), a.k_groups}};
      // sage2's Q is quantized by the attention kernel. Where K's heads are held by groups, sage1's Q
      // or sage2's V (unless first) is coded in their launch.
      if (s.k_one_read) {
        const HeadTarget v_head{s.v_view(), true, true, v_target, s.v_scale.as<float>(), s.v_work.as<std::uint8_t>(),
                                a.v_length};
        const bool beside_keys = quantize_int8_key_heads(k, s.options.quant_gran, s.k_mean_work.as(), next(), stream,
                                                         sage2 ? nullptr : &q,
                                                         sage2 && s.fp8_one_read && !v_first ? &v_head : nullptr,
                                                         s.fp8_heads_work.as());
        if (!sage2 && !beside_keys) quantize_int8({q}, s.options.quant_gran, next(), stream);
        v_done = sage2 && beside_keys;
      } else if (sage2) {
        quantize_int8({k}, s.options.quant_gran, next(), stream);
      } else {
        // K's blocks first: where K is smoothed, channel_means has just read it, and part of it is
        // still in L2. Q's blocks first here changed nothing on the short shapes; Q in a launch of
        // its own before the means, which then run beside it, was mixed: -2.5 % at Flux, +4 % at
        // 2x24x4250x64 (H100, bench/results/experiments.md: 2026-11-25-h100-no-wait).
        quantize_int8({k, q}, s.options.quant_gran, next(), stream);
      }
      if (!sage2) {
        if (s.p.bshd) copy_to_bhsd(s.v_view(), s.v_work.as(), next(), stream);
      } else if (v_two_pass) {
        quantize_fp8_values(s.v_view(), {s.amax.as<unsigned>(), true, false, v_target, s.v_scale.as<float>()},
                            s.v_work.as<std::uint8_t>(), a.v_length, next(), stream);
      } else if (!v_first && !v_done) {
        quantize_v_one_read();
      }
      break;
    }
    case QuantizedKind::fa3_fp8: {
      if (s.fp8_one_read) {  // one launch, each input read once
        quantize_fp8_heads({{s.q_view(), false, false, 448.0f, s.q_scale.as<float>(), s.q_work.as<std::uint8_t>(),
                             a.q_rows},
                            {s.k_view(), false, false, 448.0f, s.k_scale.as<float>(), s.k_work.as<std::uint8_t>(),
                             a.k_rows},
                            {s.v_view(), true, false, 448.0f, s.v_scale.as<float>(), s.v_work.as<std::uint8_t>(),
                             a.v_length}},
                           s.fp8_heads_work.as(), next(), stream);
        break;
      }
      const bool per_tensor = s.options.fp8_scale == Fp8Scale::per_tensor;
      unsigned* q_amax = s.amax.as<unsigned>();
      unsigned* k_amax = q_amax + s.p.shape.batch * s.p.shape.heads_q;
      unsigned* v_amax = k_amax + s.p.shape.batch * s.p.shape.heads_kv;
      ATTNREPLAY_CUDA_CHECK(cudaMemsetAsync(s.amax.as(), 0, s.amax.bytes(), stream));
      // One launch for the three maxima and one for Q's and K's codes: fewer launches is what the
      // short calls' preparation is made of.
      abs_max({{s.q_view(), q_amax}, {s.k_view(), k_amax}, {s.v_view(), v_amax}}, false, per_tensor, next(), stream);
      quantize_fp8_rows({{s.q_view(), {q_amax, false, per_tensor, 448.0f, s.q_scale.as<float>()},
                          s.q_work.as<std::uint8_t>(), a.q_rows},
                         {s.k_view(), {k_amax, false, per_tensor, 448.0f, s.k_scale.as<float>()},
                          s.k_work.as<std::uint8_t>(), a.k_rows}},
                        next(), stream);
      quantize_fp8_values(s.v_view(), {v_amax, false, per_tensor, 448.0f, s.v_scale.as<float>()},
                          s.v_work.as<std::uint8_t>(), a.v_length, next(), stream);
      break;
    }
  }
  // The attention that follows its own preparation overlaps that preparation's last kernel.
  s.attention_order = order;
}

void kind_attention(QuantizedKind kind, const KernelJob& job) {
  switch (kind) {
    case QuantizedKind::flash: return flash_attention(job);
    case QuantizedKind::sage1_int8: return sage1_int8_attention(job);
    case QuantizedKind::sage2_int8_fp8: return sage2_int8_fp8_attention(job);
    case QuantizedKind::fa3_fp8: return fa3_fp8_attention(job);
  }
}

namespace {

// The kernel parameters of calls (or splits) that one launch attends to, grid z each.
std::vector<AttentionParams> parts_parameters(QuantizedKind kind, const std::vector<AttentionArgs>& parts) {
  std::vector<AttentionParams> made;
  KernelJob job;
  job.what = KernelJob::What::make_parts;
  job.args = &parts.front();
  job.parts = &parts;
  job.made = &made;
  kind_attention(kind, job);
  return made;
}

template <typename Element>
__global__ void combine_key_splits_kernel(const float* parts, const float* lse, int splits, std::int64_t rows,
                                          int out_dim, Element* out) {
  const std::int64_t row = blockIdx.x;
  float largest = -INFINITY;
  for (int i = 0; i < splits; ++i) largest = fmaxf(largest, lse[i * rows + row]);
  for (int c = static_cast<int>(threadIdx.x); c < out_dim; c += static_cast<int>(blockDim.x)) {
    float weights = 0.0f, sum = 0.0f;
    if (largest != -INFINITY) {
      for (int i = 0; i < splits; ++i) {
        const float weight = exp2f(lse[i * rows + row] - largest);  // 0 for a split that saw no key
        weights += weight;
        sum += weight * parts[(i * rows + row) * out_dim + c];
      }
    }
    const float value = weights > 0.0f ? sum / weights : 0.0f;
    if constexpr (std::is_same_v<Element, __nv_bfloat16>) out[row * out_dim + c] = __float2bfloat16_rn(value);
    else out[row * out_dim + c] = __float2half_rn(value);
  }
}

}  // namespace

void combine_key_splits(const float* parts, const float* lse, int splits, std::int64_t rows, int out_dim,
                        Element element, void* out, cudaStream_t stream) {
  if (rows == 0) return;
  const dim3 grid(static_cast<unsigned>(rows));
  if (element == Element::bf16) {
    launch_kernel("combine_key_splits", combine_key_splits_kernel<__nv_bfloat16>, grid, 128, 0, Order::after_all, stream,
                  parts, lse, splits, rows, out_dim, static_cast<__nv_bfloat16*>(out));
  } else {
    launch_kernel("combine_key_splits", combine_key_splits_kernel<__half>, grid, 128, 0, Order::after_all, stream,
                  parts, lse, splits, rows, out_dim, static_cast<__half*>(out));
  }
}

void Attention::run(cudaStream_t stream) {
  State& s = *state_;
  State::KeySplits& splits = s.splits;
  if (!splits.planned) {
    splits.planned = true;
    // Not under a CUDA graph's capture (a job's, under substitution): the splits' parameters come
    // from the host, by a copy that a graph would repeat from memory gone by then.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    const bool capturing = cudaStreamIsCapturing(stream, &capture) == cudaSuccess && capture != cudaStreamCaptureStatusNone;
    const int count = capturing || !s.p.split_keys
                          ? 1
                          : key_split_count(s.args.batch, s.args.heads_q, s.args.seq_q, s.args.seq_kv, s.args.causal);
    if (count > 1) {
      const AttentionArgs& a = s.args;
      const std::int64_t rows = a.heads_q * a.seq_q;
      const std::int64_t split_keys = key_split_keys(a.seq_kv, count);
      splits.rows.allocate(s.memory, static_cast<std::size_t>(count * rows * a.out_dim) * sizeof(float), "key splits' rows");
      splits.lse.allocate(s.memory, static_cast<std::size_t>(count * rows) * sizeof(float), "key splits' sums");
      // K's scales per block (Sage kinds; fa3's are per head, flash has none): the split's from its block on.
      const std::int64_t scales_per_block = a.k_rows > 0 ? a.k_groups / ceil_div(a.k_rows, kBlockK) : 0;
      std::vector<AttentionArgs> parts;
      for (int i = 0; i < count; ++i) {
        AttentionArgs part = a;
        part.key_begin = i * split_keys;
        part.seq_kv = std::min(a.seq_kv - part.key_begin, split_keys);
        if (scales_per_block > 0) part.k_scale = a.k_scale + part.key_begin / kBlockK * scales_per_block;
        part.split_out = splits.rows.as<float>() + i * rows * a.out_dim;
        part.split_lse = splits.lse.as<float>() + i * rows;
        parts.push_back(part);
      }
      const std::vector<AttentionParams> made = parts_parameters(s.kind, parts);
      splits.parts.allocate(s.memory, made.size() * sizeof(AttentionParams), "key splits' kernel parameters");
      // From pageable memory: staged before the call returns, so `made` may go; no wait for the device.
      ATTNREPLAY_CUDA_CHECK(cudaMemcpyAsync(splits.parts.as(), made.data(), splits.parts.bytes(),
                                            cudaMemcpyHostToDevice, stream));
      splits.count = count;
      // The kernel reads its parameters before it waits for the work before it: not overlapping
      // the copy that brings them.
      s.attention_order = Order::after_all;
    }
  }
  KernelJob job;
  job.args = &s.args;
  job.order = std::exchange(s.attention_order, Order::after_all);
  job.stream = stream;
  if (splits.count > 1) {
    job.what = KernelJob::What::launch_parts;
    job.device_parts = splits.parts.as<AttentionParams>();
    job.part_count = splits.count;
    job.longest_seq_q = s.args.seq_q;
    kind_attention(s.kind, job);
    combine_key_splits(splits.rows.as<float>(), splits.lse.as<float>(), splits.count, s.args.heads_q * s.args.seq_q,
                       s.args.out_dim, s.args.element, s.args.out, stream);
    return;
  }
  kind_attention(s.kind, job);
}

void Attention::synchronize() { ATTNREPLAY_CUDA_CHECK(cudaDeviceSynchronize()); }

void Attention::download_output(void* host, std::size_t bytes) {
  if (bytes != state_->out.bytes()) {
    throw std::invalid_argument("download_output: " + std::to_string(bytes) + " bytes asked for, the output has " +
                                std::to_string(state_->out.bytes()));
  }
  ATTNREPLAY_CUDA_CHECK(cudaMemcpy(host, state_->out.as(), bytes, cudaMemcpyDeviceToHost));
}

const void* Attention::device_output() const { return state_->out.as(); }

struct AttentionTogether::State {
  QuantizedKind kind = QuantizedKind::flash;
  AttentionArgs first;
  DeviceBuffer parts;  // the calls' AttentionParams, in order
  int count = 0;
  std::int64_t longest_seq_q = 0;
};

AttentionTogether::AttentionTogether(const std::vector<Attention*>& calls) : state_(std::make_unique<State>()) {
  State& s = *state_;
  if (calls.empty()) return;
  constexpr std::size_t kGridLimit = 65535;  // grid z
  if (calls.size() > kGridLimit) {
    throw std::invalid_argument("attention of " + std::to_string(calls.size()) + " calls in one launch (at most 65535)");
  }
  const Attention::State& first = *calls.front()->state_;
  std::vector<AttentionArgs> args;
  for (const Attention* call : calls) {
    const Attention::State& c = *call->state_;
    const AttentionArgs& a = c.args;
    const AttentionArgs& f = first.args;
    if (c.kind != first.kind || a.batch != 1 || a.head_dim != f.head_dim || a.out_dim != f.out_dim ||
        a.element != f.element || a.heads_q != f.heads_q || a.heads_kv != f.heads_kv ||
        a.granularity != f.granularity || a.pv_accumulation != f.pv_accumulation) {
      throw std::invalid_argument("attention in one launch: calls of one kind, element type, head dims, heads and "
                                  "options, of batch 1 each");
    }
    args.push_back(a);
    s.longest_seq_q = std::max(s.longest_seq_q, a.seq_q);
  }
  const std::vector<AttentionParams> made = parts_parameters(first.kind, args);
  s.parts.allocate(nullptr, made.size() * sizeof(AttentionParams), "the calls' kernel parameters");
  ATTNREPLAY_CUDA_CHECK(cudaMemcpy(s.parts.as(), made.data(), s.parts.bytes(), cudaMemcpyHostToDevice));
  s.kind = first.kind;
  s.first = args.front();
  s.count = static_cast<int>(made.size());
}

AttentionTogether::~AttentionTogether() = default;

void AttentionTogether::run(cudaStream_t stream) {
  const State& s = *state_;
  if (s.count == 0 || s.longest_seq_q == 0) return;  // no rows to compute
  KernelJob job;
  job.what = KernelJob::What::launch_parts;
  job.args = &s.first;
  job.order = Order::after_all;  // the calls' preparations were queued apart, each its own chain
  job.stream = stream;
  job.device_parts = s.parts.as<AttentionParams>();
  job.part_count = s.count;
  job.longest_seq_q = s.longest_seq_q;
  kind_attention(s.kind, job);
}

}  // namespace attnreplay::cuda_attention
