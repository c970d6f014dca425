#pragma once
// An attention op's arguments as capture reads them: by the names its schema gives, Q, K and V
// found by name or place, and the attention output among its outputs. Looked up once a call.
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

#include <array>
#include <initializer_list>
#include <string>
#include <vector>

namespace attnreplay::capture {

struct NamedInput {
  std::string name;
  const c10::IValue* value;
};

// A call's arguments by name (arg<i> past its schema's), with its Q, K and V: null where the op
// has none to find.
struct CallArguments {
  std::vector<NamedInput> named;
  std::array<const c10::IValue*, 3> qkv{};
};
CallArguments call_arguments(const c10::FunctionSchema* schema, c10::ArrayRef<c10::IValue> inputs);

// The first of `names` the call has; null when none.
const c10::IValue* find_input(const std::vector<NamedInput>& inputs, std::initializer_list<const char*> names);
// The KV-cache form (vLLM's _vllm_fa2_C::fwd_kvcache): the keys are `kcache`, and `k` and `v` are
// keys and values it appends to the cache before attending.
bool kv_cache_form(const std::vector<NamedInput>& inputs);
// The tensor `value` holds, where it holds a defined one; else null.
const at::Tensor* defined_tensor(const c10::IValue* value);
// A scalar argument as text ("True", "0.5", "1,2"); empty for what is not one.
std::string scalar_text(const c10::IValue& value);
// Tensors that are not real data: compile-time fake tensors, meta tensors, functional wrappers.
bool is_placeholder(const at::Tensor& tensor);
// The attention output among an op's outputs: the first defined tensor, also where the op returns
// a list (vLLM's builds of flash-attn return Tensor[]: the output, then the log-sum-exp).
const at::Tensor* attention_output(c10::ArrayRef<c10::IValue> outputs);

}  // namespace attnreplay::capture
