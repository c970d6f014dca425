#include "replay/run/generate.h"

#include <cmath>
#include <numeric>
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

HostTensor int32_tensor(std::vector<std::int64_t> shape, const std::vector<std::int64_t>& values) {
  return HostTensor::from_doubles(DType::int32, std::move(shape), std::vector<double>(values.begin(), values.end()));
}

// A batch routine's call. Lengths and the page order come from raw mt19937_64 outputs, which every
// standard library gives alike (its distributions differ).
AttentionCall generate_batch_call(const GeneratedCallSpec& spec) {
  const AttentionShape& s = spec.shape;
  const bool paged = spec.routine != BatchRoutine::prefill_ragged;
  const std::string routine(batch_routine_name(spec.routine));
  if (paged && spec.page_size <= 0) throw InputError(fmt::format("--page_size: {} needs a page size", routine));
  if (!paged && spec.page_size > 0) throw InputError(fmt::format("--page_size: {} has no pages", routine));
  if (spec.routine == BatchRoutine::decode_paged && s.seq_q != 1) {
    throw InputError(fmt::format("--s_qo: {} decodes one query per sequence, got {}", routine, s.seq_q));
  }
  std::seed_seq sequence{spec.seed, std::uint64_t{3}};
  std::mt19937_64 generator(sequence);
  auto draw = [&generator](std::int64_t most) { return 1 + static_cast<std::int64_t>(generator() % static_cast<std::uint64_t>(most)); };
  std::vector<std::int64_t> cu_q{0}, cu_k{0}, k_lens;
  for (std::int64_t b = 0; b < s.batch; ++b) {
    const std::int64_t k_len = spec.random_actual_seq_len ? draw(s.seq_kv) : s.seq_kv;
    const std::int64_t q_len = spec.random_actual_seq_len ? draw(std::min(s.seq_q, k_len)) : s.seq_q;
    k_lens.push_back(k_len);
    cu_q.push_back(cu_q.back() + q_len);
    cu_k.push_back(cu_k.back() + k_len);
  }
  AttentionCall call;
  call.source = "generated";
  call.op = routine;
  call.layout = Layout::thd;
  call.is_causal = spec.is_causal;
  call.causal_alignment = CausalAlignment::bottom_right;
  call.scale = spec.scale;
  call.enable_gqa = s.is_gqa();
  call.q = normal_tensor(spec.dtype, {cu_q.back(), s.heads_q, s.head_dim_qk}, spec.seed, 0);
  call.cu_seqlens_q = int32_tensor({s.batch + 1}, cu_q);
  if (!paged) {
    call.k = normal_tensor(spec.dtype, {cu_k.back(), s.heads_kv, s.head_dim_qk}, spec.seed, 1);
    call.v = normal_tensor(spec.dtype, {cu_k.back(), s.heads_kv, s.head_dim_vo}, spec.seed, 2);
    call.cu_seqlens_k = int32_tensor({s.batch + 1}, cu_k);
  } else {
    std::int64_t pages = 0, width = 0;
    for (std::int64_t k_len : k_lens) {
      const std::int64_t needed = (k_len + spec.page_size - 1) / spec.page_size;
      pages += needed, width = std::max(width, needed);
    }
    std::vector<std::int64_t> order(static_cast<std::size_t>(pages));
    std::iota(order.begin(), order.end(), 0);
    for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[generator() % i]);  // Fisher-Yates
    std::vector<std::int64_t> table(static_cast<std::size_t>(s.batch * width), -1);
    std::size_t dealt = 0;
    for (std::int64_t b = 0; b < s.batch; ++b) {
      for (std::int64_t j = 0; j * spec.page_size < k_lens[static_cast<std::size_t>(b)]; ++j) {
        table[static_cast<std::size_t>(b * width + j)] = order[dealt++];
      }
    }
    call.k = normal_tensor(spec.dtype, {pages, spec.page_size, s.heads_kv, s.head_dim_qk}, spec.seed, 1);
    call.v = normal_tensor(spec.dtype, {pages, spec.page_size, s.heads_kv, s.head_dim_vo}, spec.seed, 2);
    call.block_table = int32_tensor({s.batch, width}, table);
    call.seqused_k = int32_tensor({s.batch}, k_lens);
  }
  call.metadata["seed"] = std::to_string(spec.seed);
  call.sequences();  // checks what was made
  return call;
}

}  // namespace

std::string_view batch_routine_name(BatchRoutine routine) {
  switch (routine) {
    case BatchRoutine::none: return "";
    case BatchRoutine::prefill_ragged: return "BatchPrefillWithRaggedKVCacheWrapper";
    case BatchRoutine::prefill_paged: return "BatchPrefillWithPagedKVCacheWrapper";
    case BatchRoutine::decode_paged: return "BatchDecodeWithPagedKVCacheWrapper";
  }
  return "?";
}

const std::vector<std::string>& batch_routine_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (auto routine : {BatchRoutine::prefill_ragged, BatchRoutine::prefill_paged, BatchRoutine::decode_paged}) {
      out.emplace_back(batch_routine_name(routine));
    }
    return out;
  }();
  return names;
}

std::optional<BatchRoutine> parse_batch_routine(std::string_view text) {
  for (auto routine : {BatchRoutine::prefill_ragged, BatchRoutine::prefill_paged, BatchRoutine::decode_paged}) {
    if (text == batch_routine_name(routine)) return routine;
  }
  return std::nullopt;
}

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
  if (spec.routine != BatchRoutine::none) return generate_batch_call(spec);
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
  if (spec.routine != BatchRoutine::none) {
    flags += fmt::format(" --routine {}", batch_routine_name(spec.routine));
    if (spec.page_size > 0) flags += fmt::format(" --page_size {}", spec.page_size);
    if (spec.random_actual_seq_len) flags += " --random_actual_seq_len";
  }
  return flags;
}

}  // namespace attnreplay
