// Capture's reading of an op's arguments, alone: schemas as the libraries register them, the
// arguments a call passes, no dispatcher.
#include <ATen/ATen.h>
#include <catch2/catch_test_macros.hpp>
#include <torch/csrc/jit/frontend/function_schema_parser.h>

#include <vector>

#include "capture/call_arguments.h"

using namespace attnreplay::capture;

namespace {

std::string name_of(const std::vector<NamedInput>& named, const c10::IValue* value) {
  for (const auto& input : named)
    if (input.value == value) return input.name;
  return "(none)";
}

}  // namespace

TEST_CASE("call arguments: named by the schema, Q, K and V by name, past the schema by place") {
  const c10::FunctionSchema schema = torch::jit::parseSchema(
      "flash_attn::_flash_attn_varlen_forward(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, "
      "Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float dropout_p, float softmax_scale, "
      "bool causal) -> (Tensor, Tensor)");
  const at::Tensor q = at::zeros({5, 4, 16}), k = at::zeros({7, 2, 16}), v = at::zeros({7, 2, 16});
  const at::Tensor offsets = at::zeros({3}, at::kInt);
  const std::vector<c10::IValue> stack{q, k, v, offsets, offsets, 4, 5, 0.0, 0.25, true, c10::IValue(7)};
  const CallArguments arguments = call_arguments(&schema, stack);
  REQUIRE(arguments.named.size() == stack.size());
  CHECK(arguments.named[3].name == "cu_seqlens_q");
  CHECK(arguments.named.back().name == "arg10");  // an argument past the schema keeps its place
  CHECK(name_of(arguments.named, arguments.qkv[0]) == "q");
  CHECK(name_of(arguments.named, arguments.qkv[2]) == "v");
  CHECK(scalar_text(*find_input(arguments.named, {"causal"})) == "True");
  CHECK(scalar_text(*find_input(arguments.named, {"softmax_scale"})) == "0.25");
  CHECK(find_input(arguments.named, {"seqused_k", "cu_seqlens_k"}) == &stack[4]);
  CHECK(defined_tensor(find_input(arguments.named, {"max_seqlen_q"})) == nullptr);
}

TEST_CASE("call arguments: a KV-cache op attends to its cache, not the keys it appends") {
  const c10::FunctionSchema schema = torch::jit::parseSchema(
      "_vllm_fa2_C::fwd_kvcache(Tensor! q, Tensor kcache, Tensor vcache, Tensor? k, Tensor? v, "
      "Tensor? seqlens_k) -> Tensor[]");
  const at::Tensor q = at::zeros({3, 1, 4, 16}), cache = at::zeros({3, 8, 2, 16}), fresh = at::zeros({3, 1, 2, 16});
  const std::vector<c10::IValue> stack{q, cache, cache, fresh, fresh, c10::IValue()};
  const CallArguments arguments = call_arguments(&schema, stack);
  CHECK(kv_cache_form(arguments.named));
  CHECK(name_of(arguments.named, arguments.qkv[1]) == "kcache");
  CHECK(name_of(arguments.named, arguments.qkv[2]) == "vcache");
  CHECK(defined_tensor(find_input(arguments.named, {"seqlens_k"})) == nullptr);
}

TEST_CASE("call arguments: ops naming their inputs otherwise give their first three tensors, or none") {
  const c10::FunctionSchema named_otherwise =
      torch::jit::parseSchema("sageattention::qk_int8_sv_f8(Tensor x, float s, Tensor y, Tensor z, Tensor w) -> Tensor");
  const at::Tensor t = at::zeros({1, 2, 4, 8});
  const std::vector<c10::IValue> stack{t, 0.5, t, t, t};
  const CallArguments arguments = call_arguments(&named_otherwise, stack);
  CHECK(arguments.qkv[0] == &stack[0]);
  CHECK(arguments.qkv[1] == &stack[2]);
  CHECK(arguments.qkv[2] == &stack[3]);

  const std::vector<c10::IValue> two_tensors{t, 0.5, t};
  CHECK(call_arguments(&named_otherwise, two_tensors).qkv[0] == nullptr);
  // No schema at all (a Python entry point's call): arg<i> names.
  CHECK(call_arguments(nullptr, stack).named[1].name == "arg1");
}

TEST_CASE("call arguments: the attention output is the first defined tensor, also inside a list") {
  const at::Tensor out = at::ones({2, 3}), lse = at::zeros({3});
  const std::vector<c10::IValue> tensors{at::Tensor(), out, lse};
  CHECK(attention_output(tensors) == &tensors[1].toTensor());
  const std::vector<c10::IValue> listed{c10::IValue(c10::List<at::Tensor>({out, lse}))};
  const at::Tensor* found = attention_output(listed);
  REQUIRE(found != nullptr);
  CHECK(found->equal(out));
  CHECK(attention_output(std::vector<c10::IValue>{c10::IValue(3)}) == nullptr);
  CHECK(is_placeholder(at::empty({2}, at::kMeta)));
  CHECK_FALSE(is_placeholder(out));
}
