#include "capture/call_arguments.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

namespace attnreplay::capture {

bool is_placeholder(const at::Tensor& tensor) {
  if (!tensor.defined()) return false;
  if (tensor.is_meta() || !tensor.has_storage()) return true;
  const auto keys = tensor.key_set();
  return keys.has(c10::DispatchKey::Python) || keys.has(c10::DispatchKey::Functionalize);
}

namespace {

std::vector<NamedInput> named_inputs(const c10::FunctionSchema* schema, c10::ArrayRef<c10::IValue> inputs) {
  std::vector<NamedInput> named;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    std::string name = schema && i < schema->arguments().size() ? schema->arguments()[i].name() : fmt::format("arg{}", i);
    named.push_back({std::move(name), &inputs[i]});
  }
  return named;
}

}  // namespace

const c10::IValue* find_input(const std::vector<NamedInput>& inputs, std::initializer_list<const char*> names) {
  for (const char* wanted : names)
    for (const auto& input : inputs)
      if (input.name == wanted) return input.value;
  return nullptr;
}

bool kv_cache_form(const std::vector<NamedInput>& inputs) {
  return find_input(inputs, {"kcache"}) && find_input(inputs, {"vcache"});
}

namespace {

// Q, K, V by name, or the first three tensors for ops that name them otherwise.
std::array<const c10::IValue*, 3> find_qkv(const std::vector<NamedInput>& inputs) {
  std::array<const c10::IValue*, 3> qkv =
      kv_cache_form(inputs)
          ? std::array{find_input(inputs, {"q"}), find_input(inputs, {"kcache"}), find_input(inputs, {"vcache"})}
          : std::array{find_input(inputs, {"query", "q"}), find_input(inputs, {"key", "k"}),
                       find_input(inputs, {"value", "v"})};
  if (qkv[0] && qkv[1] && qkv[2]) return qkv;
  std::size_t found = 0;
  for (const auto& input : inputs) {
    if (input.value->isTensor() && found < 3) qkv[found++] = input.value;
  }
  return found == 3 ? qkv : std::array<const c10::IValue*, 3>{};
}

}  // namespace

CallArguments call_arguments(const c10::FunctionSchema* schema, c10::ArrayRef<c10::IValue> inputs) {
  CallArguments arguments;
  arguments.named = named_inputs(schema, inputs);
  arguments.qkv = find_qkv(arguments.named);
  return arguments;
}

std::string scalar_text(const c10::IValue& value) {
  if (value.isNone()) return "None";
  if (value.isBool()) return value.toBool() ? "True" : "False";
  if (value.isInt()) return std::to_string(value.toInt());
  if (value.isDouble()) return fmt::format("{}", value.toDouble());
  if (value.isString()) return value.toStringRef();
  if (value.isIntList()) return fmt::format("{}", fmt::join(value.toIntVector(), ","));
  return {};
}

const at::Tensor* defined_tensor(const c10::IValue* value) {
  return value && value->isTensor() && value->toTensor().defined() ? &value->toTensor() : nullptr;
}

const at::Tensor* attention_output(c10::ArrayRef<c10::IValue> outputs) {
  for (const c10::IValue& output : outputs) {
    if (output.isTensor() && output.toTensor().defined()) return &output.toTensor();
    if (output.isList()) {
      for (const c10::IValue& element : output.toListRef()) {
        if (element.isTensor() && element.toTensor().defined()) return &element.toTensor();
      }
      return nullptr;
    }
  }
  return nullptr;
}

}  // namespace attnreplay::capture
