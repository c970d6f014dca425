// The emulations of our kernels on the calls of LLMs (kernels/quantized_attention.h): masks read as
// structure (padding, causality, windows, packed documents), ragged and paged batches, decode. Each
// kind's error against the fp64 reference, over the rows that see a key, is that of the same kind on
// the same data unmasked; and a mask run as structure gives what the same mask run densely gives.
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "formats/mask_structure.h"
#include "kernels/kernel.h"
#include "kernels/per_sequence.h"
#include "kernels/quantized_attention.h"
#include "kernels/quantized_kinds.h"
#include "kernels/reference.h"
#include "replay/judge/compare.h"
#include "replay/run/generate.h"

using namespace attnreplay;

namespace {

using Visible = std::function<bool(std::int64_t b, std::int64_t i, std::int64_t j)>;

AttentionCall generated(const AttentionShape& shape, std::uint64_t seed = 11) {
  GeneratedCallSpec spec;
  spec.shape = shape;
  spec.dtype = DType::bfloat16;
  spec.seed = seed;
  return generate_call(spec);
}

HostTensor bool_mask(const AttentionShape& s, const Visible& visible) {
  std::vector<double> values;
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t i = 0; i < s.seq_q; ++i)
      for (std::int64_t j = 0; j < s.seq_kv; ++j) values.push_back(visible(b, i, j) ? 1.0 : 0.0);
  return HostTensor::from_doubles(DType::boolean, {s.batch, 1, s.seq_q, s.seq_kv}, values);
}

double emulated_rel_l2(const AttentionCall& call, QuantizedKind kind) {
  const HostTensor out = output_in_dtype(emulate_attention(call, kind, QuantOptions{}), call.q.dtype);
  return compare_to_reference(out, reference_attention(call)).rel_l2;
}

// The same call with its visibility forced dense: its mask applied score by score.
AttentionCall dense_twin(const AttentionCall& call) {
  AttentionCall dense = call;
  CallVisibility visibility = read_call_visibility(call);
  std::optional<std::int64_t> upper;
  if (call.is_causal) upper = call.diagonal_offset(call.shape());
  visibility.structure = MaskStructure::all_visible(call.shape()).with_diagonals(upper, std::nullopt);
  visibility.dense_mask = true;
  dense.visibility = std::make_shared<const CallVisibility>(visibility);
  return dense;
}

struct StructuredCase {
  std::string name;
  AttentionShape shape;
  bool causal = false;
  CausalAlignment alignment = CausalAlignment::top_left;
  std::optional<std::int64_t> window_left;
  Visible visible;  // empty: no mask
  std::string found;  // what the mask reads as
};

std::vector<StructuredCase> structured_cases() {
  const std::vector<std::int64_t> pads = {0, 37, 150};
  return {
      {"causal prefill, left-padded batch", {3, 4, 2, 200, 200, 64, 64}, false, CausalAlignment::top_left, {},
       [pads](auto b, auto i, auto j) { return j <= i && j >= pads[b]; }, "causal + left padding, keys from 0/37/150"},
      {"decode, 4 rows, left-padded keys", {3, 4, 2, 4, 300, 64, 64}, true, CausalAlignment::bottom_right, {},
       [pads](auto b, auto, auto j) { return j >= pads[b]; }, "left padding, keys from 0/37/150"},
      {"right padding, no causality", {2, 2, 2, 160, 260, 128, 128}, false, CausalAlignment::top_left, {},
       [](auto b, auto, auto j) { return j < (b == 0 ? 260 : 131); }, "right padding, keys up to 260/131"},
      {"causal packed documents", {1, 4, 4, 300, 300, 64, 64}, false, CausalAlignment::top_left, {},
       [](auto, auto i, auto j) {
         auto doc = [](std::int64_t t) { return t < 90 ? 0 : t < 230 ? 1 : 2; };
         return j <= i && doc(i) == doc(j);
       },
       "causal + 3 packed documents"},
      {"sliding window of 64 keys, causal (the call's own)", {1, 4, 2, 300, 300, 64, 64}, true,
       CausalAlignment::top_left, 63, {}, ""},
  };
}

constexpr QuantizedKind kKinds[] = {QuantizedKind::flash, QuantizedKind::sage1_int8, QuantizedKind::sage2_int8_fp8,
                                    QuantizedKind::fa3_fp8};

}  // namespace

TEST_CASE("emulations on structured masks err as they do unmasked, and as the mask run densely", "[quant][mask]") {
  for (const StructuredCase& c : structured_cases()) {
    const AttentionCall plain = generated(c.shape);
    AttentionCall call = plain;
    call.is_causal = c.causal;
    call.causal_alignment = c.alignment;
    call.window_left = c.window_left;
    if (c.visible) call.mask = bool_mask(c.shape, c.visible);
    const CallVisibility visibility = read_call_visibility(call);
    INFO(c.name << ": " << visibility.mask_found);
    CHECK_FALSE(visibility.dense_mask);
    CHECK(visibility.mask_found == c.found);
    call.visibility = std::make_shared<const CallVisibility>(visibility);
    for (const QuantizedKind kind : kKinds) {
      INFO(to_string(kind));
      const double unmasked = emulated_rel_l2(plain, kind);
      const double structured = emulated_rel_l2(call, kind);
      // Fewer keys per row make a row's error a little noisier, not larger in kind.
      CHECK(structured < 1.5 * unmasked);
      CHECK(structured > 0.5 * unmasked);
      if (call.mask) {
        // The mask run densely (a bias per score) differs only by where the scale is applied.
        const double dense = emulated_rel_l2(dense_twin(call), kind);
        CHECK(std::abs(dense - structured) < 0.05 * unmasked);
      }
    }
  }
}

TEST_CASE("emulations on ragged and paged batches and decode err as on dense calls", "[quant][mask]") {
  const Kernel* flash = KernelRegistry::instance().find("flash-cpu");
  REQUIRE(flash);
  struct BatchCase {
    std::string name;
    BatchRoutine routine;
    AttentionShape shape;
    std::int64_t page_size = 0;
  };
  const std::vector<BatchCase> cases = {
      {"ragged prefill", BatchRoutine::prefill_ragged, {4, 4, 2, 150, 150, 64, 64}},
      {"paged prefill, page 16", BatchRoutine::prefill_paged, {4, 4, 2, 150, 150, 64, 64}, 16},
      {"paged decode, page 1", BatchRoutine::decode_paged, {6, 8, 2, 1, 300, 128, 128}, 1},
      {"paged decode, page 64", BatchRoutine::decode_paged, {6, 8, 2, 1, 300, 128, 128}, 64},
  };
  const AttentionCall dense_baseline = generated({2, 4, 2, 150, 150, 64, 64});
  for (const BatchCase& c : cases) {
    GeneratedCallSpec spec;
    spec.shape = c.shape;
    spec.routine = c.routine;
    spec.page_size = c.page_size;
    spec.random_actual_seq_len = true;
    spec.seed = 5;
    const AttentionCall call = generate_call(spec);
    REQUIRE(call.is_ragged());
    const ReferenceOutput reference = reference_attention(call);
    for (const QuantizedKind kind : kKinds) {
      const Kernel* kernel = KernelRegistry::instance().find(std::string(to_string(kind)) + "-cpu");
      REQUIRE(kernel);
      INFO(c.name << ", " << kernel->name());
      const PerSequenceKernel per_sequence(*kernel);
      REQUIRE_FALSE(per_sequence.unsupported_reason(call));
      auto prepared = per_sequence.prepare(call, KernelOptions{});
      prepared->run();
      const double ragged = compare_to_reference(prepared->output(), reference).rel_l2;
      const double dense = emulated_rel_l2(dense_baseline, kind);
      CHECK(ragged < 1.6 * dense);
      CHECK(ragged > 0.4 * dense);
    }
  }
}

TEST_CASE("a padded batch runs a batch entry at a time, cut to its keys, for kernels that take diagonals only",
          "[quant][mask]") {
  const std::vector<std::int64_t> pads = {0, 37, 150};
  const StructuredCase prefill = structured_cases()[0], decode = structured_cases()[1];
  for (const StructuredCase& c : {prefill, decode}) {
    const AttentionCall plain = generated(c.shape);
    AttentionCall call = plain;
    call.is_causal = c.causal;
    call.causal_alignment = c.alignment;
    call.mask = bool_mask(c.shape, c.visible);
    call.visibility = std::make_shared<const CallVisibility>(read_call_visibility(call));
    INFO(c.name);
    const auto parts = split_by_key_ranges(call);
    REQUIRE(parts);
    REQUIRE(parts->size() == 3);
    for (const SequencePart& part : *parts) {
      CHECK(part.keys == c.shape.seq_kv - pads[static_cast<std::size_t>(part.batch)]);
      CHECK(part.call.shape().seq_kv == part.keys);
      CHECK_FALSE(part.call.mask);
    }
    const ReferenceOutput reference = reference_attention(call);
    for (const QuantizedKind kind : kKinds) {
      const Kernel* kernel = KernelRegistry::instance().find(std::string(to_string(kind)) + "-cpu");
      REQUIRE(kernel);
      INFO(kernel->name());
      REQUIRE(runs_per_sequence(kernel->description(), call));
      const PerSequenceKernel per_sequence(*kernel);
      REQUIRE_FALSE(per_sequence.unsupported_reason(call));
      auto prepared = per_sequence.prepare(call, KernelOptions{});
      prepared->run();
      const HostTensor out = prepared->output();
      REQUIRE(out.shape == std::vector<std::int64_t>{c.shape.batch, c.shape.heads_q, c.shape.seq_q, c.shape.head_dim_vo});
      const double split = compare_to_reference(out, reference).rel_l2;
      const double unmasked = emulated_rel_l2(plain, kind);
      CHECK(split < 1.5 * unmasked);
      CHECK(split > 0.5 * unmasked);
      // The rows that see no key (the last entry's first 150 in the prefill) are 0.
      if (c.name == prefill.name) {
        const std::vector<double> values = out.to_doubles();
        const std::int64_t row = 149, b = 2, h = 3;
        for (std::int64_t d = 0; d < c.shape.head_dim_vo; ++d) {
          CHECK(values[static_cast<std::size_t>(((b * c.shape.heads_q + h) * c.shape.seq_q + row) * c.shape.head_dim_vo + d)] == 0.0);
        }
      }
    }
  }
  // A mask that is no key ranges per sequence stays whole: a kernel takes or declines it itself.
  AttentionCall documents = generated(structured_cases()[3].shape);
  documents.mask = bool_mask(documents.shape(), structured_cases()[3].visible);
  CHECK_FALSE(split_by_key_ranges(documents));
  CHECK_FALSE(runs_per_sequence(KernelRegistry::instance().find("flash-cpu")->description(), documents));
  CHECK_FALSE(runs_per_sequence(KernelRegistry::instance().find("torch-math")->description(),
                                [&] {
                                  AttentionCall padded = generated(prefill.shape);
                                  padded.mask = bool_mask(prefill.shape, prefill.visible);
                                  return padded;
                                }()));
}

namespace {

// flash-cpu, with its prepared calls joining launches as attnreplay's CUDA kernels' do: counts the
// joins, the joint runs and the runs of a call alone.
struct JoinCounts {
  int joins = 0, joined_calls = 0, joint_runs = 0, lone_runs = 0;
};

class JoiningKernel final : public Kernel {
 public:
  JoiningKernel(const Kernel& inner, JoinCounts& counts) : inner_(inner), counts_(counts) {}
  const KernelDescription& description() const override { return inner_.description(); }
  std::optional<std::string> unsupported_reason(const AttentionCall& call) const override {
    return inner_.unsupported_reason(call);
  }
  std::unique_ptr<PreparedKernel> prepare(const AttentionCall& call, const KernelOptions& options) const override {
    return std::make_unique<Prepared>(inner_.prepare(call, options), counts_);
  }

 private:
  class Prepared final : public PreparedKernel, public JoinsLaunches {
   public:
    Prepared(std::unique_ptr<PreparedKernel> inner, JoinCounts& counts) : inner_(std::move(inner)), counts_(counts) {}
    void run() override {
      ++counts_.lone_runs;
      inner_->run();
    }
    HostTensor output() override { return inner_->output(); }
    std::unique_ptr<JointLaunch> join(const std::vector<PreparedKernel*>& calls) override {
      ++counts_.joins;
      counts_.joined_calls += static_cast<int>(calls.size());
      std::vector<PreparedKernel*> inners;
      for (PreparedKernel* call : calls) inners.push_back(dynamic_cast<Prepared&>(*call).inner_.get());
      return std::make_unique<Joint>(std::move(inners), counts_);
    }

   private:
    struct Joint final : JointLaunch {
      Joint(std::vector<PreparedKernel*> calls, JoinCounts& counts) : calls(std::move(calls)), counts(counts) {}
      void run() override {
        ++counts.joint_runs;
        for (PreparedKernel* call : calls) call->run();
      }
      std::vector<PreparedKernel*> calls;
      JoinCounts& counts;
    };
    std::unique_ptr<PreparedKernel> inner_;
    JoinCounts& counts_;
  };
  const Kernel& inner_;
  JoinCounts& counts_;
};

}  // namespace

TEST_CASE("a kernel whose prepared calls join launches runs a padded batch's entries in one", "[mask]") {
  const StructuredCase prefill = structured_cases()[0];
  AttentionCall call = generated(prefill.shape);
  call.is_causal = prefill.causal;
  call.causal_alignment = prefill.alignment;
  call.mask = bool_mask(prefill.shape, prefill.visible);
  call.visibility = std::make_shared<const CallVisibility>(read_call_visibility(call));
  const Kernel& flash = *KernelRegistry::instance().find("flash-cpu");
  JoinCounts counts;
  const JoiningKernel joining(flash, counts);
  auto prepared = PerSequenceKernel(joining).prepare(call, KernelOptions{});
  CHECK(counts.joins == 1);
  CHECK(counts.joined_calls == 3);  // the three entries, each cut to its keys
  prepared->run();
  prepared->run();
  CHECK(counts.joint_runs == 2);
  CHECK(counts.lone_runs == 0);  // no entry's own run(): the joint launch covers them
  // The same output as the entries run one by one.
  auto alone = PerSequenceKernel(flash).prepare(call, KernelOptions{});
  alone->run();
  CHECK(*prepared->output().bytes == *alone->output().bytes);
}

namespace {

// A kernel that records whether each call it prepared may split its keys.
class SplitsSeenKernel final : public Kernel {
 public:
  SplitsSeenKernel(const Kernel& inner, std::vector<bool>& seen) : inner_(inner), seen_(seen) {}
  const KernelDescription& description() const override { return inner_.description(); }
  std::optional<std::string> unsupported_reason(const AttentionCall& call) const override {
    return inner_.unsupported_reason(call);
  }
  std::unique_ptr<PreparedKernel> prepare(const AttentionCall& call, const KernelOptions& options) const override {
    seen_.push_back(options.split_keys);
    return inner_.prepare(call, options);
  }

 private:
  const Kernel& inner_;
  std::vector<bool>& seen_;
};

}  // namespace

TEST_CASE("a batch's sequences keep their keys whole; a sequence alone splits them as the kernels do", "[quant][mask]") {
  // A left-padded decode step: each entry alone (2 KV heads of 4 packed rows, 2000 keys less its
  // padding) would split its keys; one launch runs the entries together, unsplit.
  const AttentionShape shape{2, 8, 2, 1, 2000, 64, 64};
  AttentionCall call = generated(shape);
  call.mask = bool_mask(shape, [](std::int64_t b, std::int64_t, std::int64_t j) { return j >= (b == 0 ? 0 : 100); });
  call.visibility = std::make_shared<const CallVisibility>(read_call_visibility(call));
  const auto parts = split_by_key_ranges(call);
  REQUIRE(parts);
  REQUIRE(prepare_attention_inputs(parts->front().call, QuantizedKind::flash, QuantOptions{}).key_splits > 1);

  const Kernel& flash = *KernelRegistry::instance().find("flash-cpu");
  std::vector<bool> seen;
  const SplitsSeenKernel recording(flash, seen);
  auto batch = PerSequenceKernel(recording).prepare(call, KernelOptions{});
  CHECK(seen == std::vector<bool>{false, false});
  // The batch's entries are each the entry's call emulated whole.
  batch->run();
  const std::vector<double> together = batch->output().to_doubles();
  KernelOptions whole;
  whole.split_keys = false;
  for (const SequencePart& part : *parts) {
    auto alone = flash.prepare(part.call, whole);
    alone->run();
    const std::vector<double> expected = alone->output().to_doubles();
    for (std::int64_t h = 0; h < shape.heads_q; ++h)
      for (std::int64_t d = 0; d < shape.head_dim_vo; ++d)
        CHECK(together[static_cast<std::size_t>((part.batch * shape.heads_q + h) * shape.head_dim_vo + d)] ==
              expected[static_cast<std::size_t>(h * shape.head_dim_vo + d)]);
  }

  // One sequence alone: its keys split.
  AttentionCall one = generated({1, 8, 2, 1, 2000, 64, 64});
  one.mask = bool_mask(one.shape(), [](std::int64_t, std::int64_t, std::int64_t j) { return j >= 100; });
  one.visibility = std::make_shared<const CallVisibility>(read_call_visibility(one));
  seen.clear();
  PerSequenceKernel(recording).prepare(one, KernelOptions{});
  CHECK(seen == std::vector<bool>{true});
}
