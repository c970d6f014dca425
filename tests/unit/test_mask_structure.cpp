// Masks read as structure (formats/mask_structure.h): every class is found exactly on generated
// masks, bool and additive, and the same mask one element off stays dense; read by torch where the
// mask lies (formats/mask_structure_torch.h), every mask here reads the same, reason for reason.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>

#include "formats/attention_call.h"
#include "formats/mask_structure.h"
#include "formats/mask_structure_torch.h"
#include "formats/torch_tensor.h"

using namespace attnreplay;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::StartsWith;

namespace {

// Whether row i of (b, h) may see key j.
using Visible = std::function<bool(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j)>;

struct MaskCase {
  std::int64_t batch = 1, heads = 1, seq_q = 8, seq_kv = 8;
  bool per_head = false;
  AttentionShape shape() const { return {batch, heads, heads, seq_q, seq_kv, 8, 8}; }
};

constexpr double kInf = std::numeric_limits<double>::infinity();

// The host's reading, checked to be the same as torch's of the same values.
MaskReading read_mask(const HostTensor& mask, const AttentionShape& shape) {
  const MaskReading host = read_mask_structure(mask, shape);
  const MaskReading torch = read_mask_structure_of_tensor(torch_view_of_host_tensor(mask), shape);
  CHECK(host.dense_reason == torch.dense_reason);
  CHECK(host.structure == torch.structure);
  return host;
}

// The mask (batch, heads or 1, seq_q, seq_kv): bool, or additive with `hidden` for a hidden key.
HostTensor make_mask(const MaskCase& c, const Visible& visible, DType dtype, double hidden = -kInf) {
  const std::int64_t heads = c.per_head ? c.heads : 1;
  std::vector<double> values;
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < c.seq_q; ++i)
        for (std::int64_t j = 0; j < c.seq_kv; ++j) {
          const bool sees = visible(b, h, i, j);
          values.push_back(dtype == DType::boolean ? (sees ? 1.0 : 0.0) : (sees ? 0.0 : hidden));
        }
  return HostTensor::from_doubles(dtype, {c.batch, heads, c.seq_q, c.seq_kv}, values);
}

// The structure rebuilds `visible` on every row of every head.
void check_rebuilds(const MaskStructure& structure, const MaskCase& c, const Visible& visible) {
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t h = 0; h < c.heads; ++h)
      for (std::int64_t i = 0; i < c.seq_q; ++i) {
        const auto [first, end] = structure.row_keys(b, h, i);
        for (std::int64_t j = 0; j < c.seq_kv; ++j) {
          INFO("b " << b << " h " << h << " row " << i << " key " << j);
          CHECK((j >= first && j < end) == visible(b, h, i, j));
        }
      }
}

// Found as structure in bool and additive (-inf, and float32's lowest) forms, described as
// `description`; then each of the given elements flipped alone leaves it dense.
MaskStructure check_class(const MaskCase& c, const Visible& visible, const std::string& description,
                          const std::vector<std::array<std::int64_t, 4>>& flips) {
  bool row_without_keys = false;
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t h = 0; h < c.heads; ++h)
      for (std::int64_t i = 0; i < c.seq_q; ++i) {
        bool any = false;
        for (std::int64_t j = 0; j < c.seq_kv; ++j) any = any || visible(b, h, i, j);
        row_without_keys = row_without_keys || !any;
      }
  MaskStructure found;
  for (const auto& [dtype, hidden] : {std::pair{DType::boolean, 0.0}, std::pair{DType::float32, -kInf},
                                      std::pair{DType::bfloat16, -kInf},
                                      std::pair{DType::float32, double(std::numeric_limits<float>::lowest())}}) {
    const MaskReading reading = read_mask(make_mask(c, visible, dtype, hidden), c.shape());
    INFO(dtype_name(dtype) << " hiding by " << hidden << ": " << reading.dense_reason);
    if (dtype != DType::boolean && std::isfinite(hidden) && row_without_keys) {
      // A row of finite hiders alone is softmax's uniform average: no structure gives that.
      CHECK_THAT(reading.dense_reason, ContainsSubstring("hides every key by finite values"));
      continue;
    }
    REQUIRE(reading.structure);
    CHECK(reading.structure->describe() == description);
    check_rebuilds(*reading.structure, c, visible);
    found = *reading.structure;
  }
  for (const auto& [fb, fh, fi, fj] : flips) {
    const Visible flipped = [&, fb = fb, fh = fh, fi = fi, fj = fj](std::int64_t b, std::int64_t h, std::int64_t i,
                                                                     std::int64_t j) {
      const bool here = b == fb && (h == fh || !c.per_head) && i == fi && j == fj;
      return here != visible(b, h, i, j);
    };
    INFO("flipped (" << fb << ", " << fh << ", " << fi << ", " << fj << ")");
    const MaskReading reading = read_mask(make_mask(c, flipped, DType::boolean), c.shape());
    CHECK_FALSE(reading.structure);
    CHECK_FALSE(reading.dense_reason.empty());
  }
  return found;
}

}  // namespace

TEST_CASE("causal masks, either alignment, are a diagonal") {
  const MaskCase square;
  const auto top_left = check_class(square, [](auto, auto, auto i, auto j) { return j <= i; }, "causal",
                                    {{0, 0, 3, 4}, {0, 0, 5, 2}, {0, 0, 4, 6}});
  CHECK(top_left.upper == 0);
  CHECK_FALSE(top_left.lower);
  MaskCase chunk;
  chunk.seq_q = 4, chunk.seq_kv = 11;
  const auto bottom_right = check_class(chunk, [](auto, auto, auto i, auto j) { return j <= i + 7; },
                                        "causal (bottom-right)", {{0, 0, 1, 9}, {0, 0, 2, 0}});
  CHECK(bottom_right.upper == 7);
  check_class(chunk, [](auto, auto, auto i, auto j) { return j <= i + 2; }, "causal (keys up to row+2)",
              {{0, 0, 1, 0}});
}

TEST_CASE("padding on either side is a key range per sequence, with causality or without") {
  MaskCase batch;
  batch.batch = 3;
  const std::int64_t pads[] = {0, 3, 5};
  const auto left = check_class(
      batch, [&](auto b, auto, auto i, auto j) { return j <= i && j >= pads[b]; }, "causal + left padding, keys from 0/3/5",
      {{1, 0, 6, 4}, {2, 0, 7, 6}, {1, 0, 6, 2}});
  CHECK(left.key_begin == std::vector<std::int64_t>{0, 3, 5});
  // Decode with a cache: one query row, left-padded keys.
  MaskCase decode = batch;
  decode.seq_q = 1, decode.seq_kv = 9;
  check_class(decode, [&](auto b, auto, auto, auto j) { return j >= pads[b]; }, "left padding, keys from 0/3/5",
              {{1, 0, 0, 6}, {1, 0, 0, 1}});
  const std::int64_t lengths[] = {8, 6, 2};
  check_class(batch, [&](auto b, auto, auto, auto j) { return j < lengths[b]; }, "right padding, keys up to 8/6/2",
              {{1, 0, 3, 6}, {0, 0, 7, 3}});
  // A sequence without any key reads as such.
  const std::int64_t begins[] = {2, 8, 1};
  check_class(batch, [&](auto b, auto, auto, auto j) { return j >= begins[b]; }, "left padding, keys from 2/none/1",
              {{2, 0, 3, 0}});
}

TEST_CASE("a key padding mask without a row dim reads once per sequence") {
  const std::int64_t lengths[] = {5, 8};
  std::vector<double> values;
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t j = 0; j < 8; ++j) values.push_back(j < lengths[b] ? 1.0 : 0.0);
  const AttentionShape shape{2, 4, 4, 6, 8, 8, 8};
  const MaskReading reading = read_mask(HostTensor::from_doubles(DType::boolean, {2, 1, 1, 8}, values), shape);
  REQUIRE(reading.structure);
  CHECK(reading.structure->describe() == "right padding, keys up to 5/8");
  CHECK(reading.structure->row_keys(0, 3, 5) == std::pair<std::int64_t, std::int64_t>{0, 5});
}

TEST_CASE("a mask expanded to every head alike is one range per sequence, as if broadcast") {
  MaskCase c;
  c.batch = 2, c.heads = 3, c.per_head = true;
  const auto found = check_class(c, [](auto b, auto, auto i, auto j) { return j <= i && j >= 3 * b; },
                                 "causal + left padding, keys from 0/3", {{1, 2, 6, 5}});
  CHECK(found.heads == 1);
}

TEST_CASE("sliding windows are two diagonals") {
  MaskCase c;
  c.seq_q = c.seq_kv = 12;
  const auto window = check_class(c, [](auto, auto, auto i, auto j) { return j <= i && j > i - 4; },
                                  "causal + a sliding window of 4 keys", {{0, 0, 9, 5}, {0, 0, 9, 8}, {0, 0, 2, 3}});
  CHECK(window.lower == -3);
  c.batch = 2;
  check_class(c, [](auto b, auto, auto i, auto j) { return j <= i && j > i - 4 && j >= 2 * b; },
              "causal + a sliding window of 4 keys + left padding, keys from 0/2", {{1, 0, 1, 1}});
}

TEST_CASE("per-head masks are a key range per (sequence, head)") {
  MaskCase c;
  c.batch = 2, c.heads = 3, c.per_head = true;
  check_class(c, [](auto b, auto h, auto i, auto j) { return j <= i && j >= b + h; },
              "causal + left padding per head, keys from 0/1/2/1/2/3", {{1, 2, 6, 5}});
}

TEST_CASE("packed documents are block-diagonal, with causality inside or not") {
  MaskCase c;
  c.seq_q = c.seq_kv = 10;
  const std::int64_t starts[] = {0, 0, 0, 3, 3, 3, 3, 7, 7, 7};
  const std::int64_t ends[] = {3, 3, 3, 7, 7, 7, 7, 10, 10, 10};
  const auto full = check_class(c, [&](auto, auto, auto i, auto j) { return j >= starts[i] && j < ends[i]; },
                                "3 packed documents", {{0, 0, 4, 7}, {0, 0, 4, 5}});
  REQUIRE(full.documents.size() == 1);
  CHECK(full.documents[0] == std::vector<MaskStructure::Document>{{0, 3, 0, 3}, {3, 7, 3, 7}, {7, 10, 7, 10}});
  const auto causal = check_class(c, [&](auto, auto, auto i, auto j) { return j >= starts[i] && j <= i; },
                                  "causal + 3 packed documents", {{0, 0, 8, 6}, {0, 0, 5, 6}});
  CHECK(causal.upper == 0);
}

TEST_CASE("masks that are no structure stay dense, saying why") {
  const AttentionShape shape{1, 1, 1, 4, 4, 8, 8};
  auto read = [&](DType dtype, std::vector<double> values) {
    return read_mask(HostTensor::from_doubles(dtype, {4, 4}, values), shape);
  };
  const double lowest = std::numeric_limits<float>::lowest();
  const auto bias = read(DType::float32, {0, 0.5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  CHECK_FALSE(bias.structure);
  CHECK_THAT(bias.dense_reason, ContainsSubstring("adds 0.5 to a score"));
  // A row of finite hiders alone is softmax's uniform average, which no row range gives.
  const auto uniform = read(DType::float32, {lowest, lowest, lowest, lowest, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  CHECK_FALSE(uniform.structure);
  CHECK_THAT(uniform.dense_reason, ContainsSubstring("hides every key by finite values"));
  // -inf hides a whole row exactly.
  const auto empty_row = read(DType::float32, {-kInf, -kInf, -kInf, -kInf, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  REQUIRE(empty_row.structure);
  CHECK(empty_row.structure->describe() == "left padding, query rows from 1");
  CHECK(empty_row.structure->row_keys(0, 0, 0).first == empty_row.structure->row_keys(0, 0, 0).second);
  const auto holes = read(DType::boolean, {1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
  CHECK_THAT(holes.dense_reason, ContainsSubstring("query row 0 of batch 0 sees keys that are not one range"));
  const auto all = read(DType::boolean, std::vector<double>(16, 1.0));
  REQUIRE(all.structure);
  CHECK(all.structure->describe() == "no key hidden");
}

TEST_CASE("a call's causality and window join its mask's structure") {
  AttentionCall call;
  call.layout = Layout::bhsd;
  call.q = HostTensor::allocate(DType::bfloat16, {2, 2, 6, 8});
  call.k = call.v = HostTensor::allocate(DType::bfloat16, {2, 2, 6, 8});
  call.is_causal = true;
  call.window_left = 2;
  std::vector<double> keys{1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1};
  call.mask = HostTensor::from_doubles(DType::boolean, {2, 1, 1, 6}, keys);
  const CallVisibility visibility = read_call_visibility(call);
  CHECK_FALSE(visibility.dense_mask);
  CHECK(visibility.mask_found == "left padding, keys from 0/2");
  CHECK(visibility.structure.describe() == "causal + a sliding window of 3 keys + left padding, keys from 0/2");
  CHECK(visibility.structure.row_keys(1, 0, 5) == std::pair<std::int64_t, std::int64_t>{3, 6});
  CHECK(visibility.structure.row_keys(1, 0, 1).first == visibility.structure.row_keys(1, 0, 1).second);
  call.mask = HostTensor::from_doubles(DType::boolean, {1, 6}, std::vector<double>{1, 0, 1, 1, 1, 1});
  const CallVisibility dense = read_call_visibility(call);
  CHECK(dense.dense_mask);
  CHECK_THAT(dense.mask_found, StartsWith("dense: query row 0"));
}

TEST_CASE("torch reads any mask as the host does: broadcast forms, dtypes, structure and near misses") {
  std::mt19937 random(7);
  auto pick = [&](std::int64_t below) { return std::uniform_int_distribution<std::int64_t>(0, below - 1)(random); };
  const DType dtypes[] = {DType::boolean, DType::float32, DType::bfloat16, DType::float16, DType::float64};
  const double hiders[] = {-kInf, double(std::numeric_limits<float>::lowest()), kHidingAddend, -1e5};
  const double strays[] = {0.5, std::numeric_limits<double>::quiet_NaN(), -1e9, kHidingAddend, -9999.0, kInf};
  std::map<std::string, int> found;  // how often each outcome came up: none may be missing
  for (int trial = 0; trial < 1500; ++trial) {
    const std::int64_t batch = 1 + pick(3), heads = 1 + pick(3), seq_q = 1 + pick(9), seq_kv = 1 + pick(9);
    const AttentionShape shape{batch, heads, heads, seq_q, seq_kv, 8, 8};
    // The mask's own dims, right-aligned against (batch, heads, seq_q, seq_kv); 1 where broadcast.
    const std::vector<std::vector<std::int64_t>> forms = {
        {seq_kv}, {seq_q, seq_kv}, {1, seq_q, seq_kv}, {heads, seq_q, seq_kv}, {batch, 1, 1, seq_kv},
        {batch, 1, seq_q, seq_kv}, {batch, heads, seq_q, seq_kv}, {1, 1, seq_q, seq_kv}, {1, heads, seq_q, seq_kv},
        {batch, heads, 1, seq_kv}};
    const std::vector<std::int64_t> dims = forms[static_cast<std::size_t>(pick(std::ssize(forms)))];
    std::int64_t full[4] = {1, 1, 1, 1};
    std::copy(dims.begin(), dims.end(), full + 4 - dims.size());
    const DType dtype = dtypes[pick(std::size(dtypes))];
    const double hidden = hiders[pick(std::size(hiders))];
    // A structure per (b, h) of the mask: a key range, a diagonal on either side or not.
    const bool causal = pick(2), window = pick(3) == 0;
    const std::int64_t offset = pick(5) - 2, width = 1 + pick(4);
    std::vector<std::int64_t> begin, end;
    for (std::int64_t g = 0; g < full[0] * full[1]; ++g) {
      begin.push_back(pick(3));
      end.push_back(seq_kv - pick(3));
    }
    std::vector<double> values;
    for (std::int64_t b = 0; b < full[0]; ++b)
      for (std::int64_t h = 0; h < full[1]; ++h)
        for (std::int64_t i = 0; i < full[2]; ++i)
          for (std::int64_t j = 0; j < full[3]; ++j) {
            const auto g = static_cast<std::size_t>(b * full[1] + h);
            bool sees = j >= begin[g] && j < end[g];
            if (causal) sees = sees && j <= i + offset;
            if (window) sees = sees && j > i + offset - width;
            values.push_back(dtype == DType::boolean ? (sees ? 1.0 : 0.0) : (sees ? 0.0 : hidden));
          }
    // Half the masks a near miss: a key flipped, a stray value, or a row of finite hiders alone.
    const auto at = static_cast<std::size_t>(pick(std::ssize(values)));
    switch (pick(6)) {
      case 0: values[at] = dtype == DType::boolean ? 1.0 - values[at] : (values[at] == 0.0 ? hidden : 0.0); break;
      case 1:
        if (dtype != DType::boolean) values[at] = strays[pick(std::size(strays))];
        break;
      case 2:
        if (dtype != DType::boolean) {
          const std::size_t row = at / static_cast<std::size_t>(full[3]) * static_cast<std::size_t>(full[3]);
          std::fill(values.begin() + static_cast<std::ptrdiff_t>(row),
                    values.begin() + static_cast<std::ptrdiff_t>(row + static_cast<std::size_t>(full[3])), -1e9);
        }
        break;
      default: break;
    }
    INFO("trial " << trial << ": " << dtype_name(dtype) << " mask of " << dims.size() << " dims for b" << batch << " h"
                  << heads << " sq" << seq_q << " skv" << seq_kv);
    const MaskReading reading = read_mask(HostTensor::from_doubles(dtype, dims, values), shape);
    std::string outcome = reading.structure ? (reading.structure->heads > 1 ? "per head" : "structure") : "no fit";
    for (const char* reason : {"adds", "hides every key", "not one range"}) {
      if (reading.dense_reason.find(reason) != std::string::npos) outcome = reason;
    }
    ++found[outcome];
  }
  for (const auto& [outcome, count] : found) UNSCOPED_INFO(outcome << ": " << count);
  CHECK(found.size() == 6);
  for (const auto& [outcome, count] : found) CHECK(count >= 20);
}
