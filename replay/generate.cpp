#include "replay/generate.h"

#include <cmath>
#include <numbers>
#include <algorithm>
#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "formats/errors.h"

namespace attnreplay {
namespace {

// Box-Muller on mt19937_64: the same numbers with every standard library, unlike
// std::normal_distribution, so a seed means the same tensors on every machine. Blocks of 2^20
// elements are seeded from (seed, tensor, block), so the numbers do not depend on how many threads
// fill them, and large calls generate in parallel.
HostTensor normal_tensor(DType dtype, std::vector<std::int64_t> shape, std::uint64_t seed, std::uint64_t tensor_id) {
  HostTensor tensor = HostTensor::allocate(dtype, std::move(shape));
  std::byte* out = tensor.mutable_data();
  const std::size_t size = dtype_size(dtype);
  const std::int64_t count = tensor.numel();
  constexpr std::int64_t kBlock = 1 << 20;
  const std::int64_t blocks = (count + kBlock - 1) / kBlock;
  auto fill = [&](std::int64_t block) {
    std::seed_seq sequence{seed, tensor_id, static_cast<std::uint64_t>(block)};
    std::mt19937_64 generator(sequence);
    auto uniform = [&generator] { return (static_cast<double>(generator() >> 11) + 0.5) * 0x1.0p-53; };
    const std::int64_t end = std::min(count, (block + 1) * kBlock);
    for (std::int64_t i = block * kBlock; i < end; i += 2) {
      const double radius = std::sqrt(-2.0 * std::log(uniform()));
      const double angle = 2.0 * std::numbers::pi * uniform();
      element_from_double(dtype, radius * std::cos(angle), out + static_cast<std::size_t>(i) * size);
      if (i + 1 < end) element_from_double(dtype, radius * std::sin(angle), out + static_cast<std::size_t>(i + 1) * size);
    }
  };
  const auto threads = static_cast<std::int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<std::int64_t> next{0};
  auto worker = [&] {
    for (std::int64_t block = next++; block < blocks; block = next++) fill(block);
  };
  std::vector<std::jthread> pool;
  for (std::int64_t t = 1; t < std::min(threads, blocks); ++t) pool.emplace_back(worker);
  worker();
  return tensor;
}

}  // namespace

AttentionCall generate_call(const GeneratedCallSpec& spec) {
  const AttentionShape& s = spec.shape;
  auto dims = [&spec](std::int64_t heads, std::int64_t seq, std::int64_t dim) -> std::vector<std::int64_t> {
    if (spec.layout == Layout::bhsd) return {spec.shape.batch, heads, seq, dim};
    return {spec.shape.batch, seq, heads, dim};
  };
  if (s.batch <= 0 || s.heads_q <= 0 || s.heads_kv <= 0 || s.seq_q <= 0 || s.seq_kv <= 0 || s.head_dim_qk <= 0 ||
      s.head_dim_vo <= 0) {
    throw InputError(fmt::format("generated shape {}: every dim must be positive", s.to_string()));
  }
  if (!dtype_is_floating(spec.dtype)) {
    throw InputError(fmt::format("generated inputs need a floating dtype, got {}", dtype_name(spec.dtype)));
  }
  AttentionCall call;
  call.source = "generated";
  call.op = "generated";
  call.layout = spec.layout;
  call.q = normal_tensor(spec.dtype, dims(s.heads_q, s.seq_q, s.head_dim_qk), spec.seed, 0);
  call.k = normal_tensor(spec.dtype, dims(s.heads_kv, s.seq_kv, s.head_dim_qk), spec.seed, 1);
  call.v = normal_tensor(spec.dtype, dims(s.heads_kv, s.seq_kv, s.head_dim_vo), spec.seed, 2);
  call.is_causal = spec.is_causal;
  call.causal_alignment = spec.causal_alignment;
  call.scale = spec.scale;
  call.enable_gqa = s.is_gqa();
  call.metadata["seed"] = std::to_string(spec.seed);
  call.shape();
  return call;
}

std::string generated_call_flags(const GeneratedCallSpec& spec) {
  const AttentionShape& s = spec.shape;
  std::string flags = fmt::format("--shape {},{},{},{} --num_kv_heads {} --s_kv {} --head_dim_vo {} --dtype {} --layout {} --seed {}",
                                  s.batch, s.heads_q, s.seq_q, s.head_dim_qk, s.heads_kv, s.seq_kv, s.head_dim_vo,
                                  dtype_name(spec.dtype), layout_name(spec.layout), spec.seed);
  if (spec.is_causal) flags += fmt::format(" --causal --causal_alignment {}", causal_alignment_name(spec.causal_alignment));
  if (spec.scale) flags += fmt::format(" --scale {:g}", *spec.scale);
  return flags;
}

}  // namespace attnreplay
