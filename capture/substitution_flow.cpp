// Kernel substitution's flow through an op (ATTNCAP_SUBSTITUTE, observation.h): whether a call is
// the kernel's to take, and its output computed in the op's place (before it, where a hook stands
// in front of an op that returns the output alone) or over the op's output after it ran.
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <variant>

#include "capture/observation.h"

namespace attnreplay::capture {

void judge_substitution(PendingCall& pending, const std::string& op, const c10::FunctionSchema* schema, bool hooked,
                        const CallArguments& arguments, std::int64_t index, const std::optional<CallPlace>& place) {
  const auto& qkv = arguments.qkv;
  if (!qkv[0]) {
    pending.left_reason = fmt::format("{}: no query/key/value tensors among its arguments", op);
    return;
  }
  const at::Tensor& query = qkv[0]->toTensor();
  pending.on_gpu = query.is_cuda();
  // A Python entry point (FlashInfer's) has returned already: the output it returned, handed over as
  // `out`, is overwritten, as after an op that ran (substitute_after_the_op).
  const bool python_call = schema && schema->name() == kPythonCall;
  const at::Tensor* python_out = python_call ? defined_tensor(find_input(arguments.named, {"out"})) : nullptr;
  if (python_call && !python_out) {
    pending.left_reason = fmt::format("{} handed over no output to replace", op);
    return;
  }
  auto reason = state->substituter->declines_early(
      index, place ? std::optional(place->position.layer) : std::nullopt,
      place ? std::optional(place->position.step) : std::nullopt, query, qkv[1]->toTensor(), qkv[2]->toTensor());
  if (reason) {
    pending.left_reason = std::move(*reason);
    return;
  }
  pending.substitute = true;
  if (python_out) pending.python_output = *python_out;
  pending.output_sizes = query.sizes().vec();
  pending.output_sizes.back() = qkv[2]->toTensor().size(-1);
  pending.output_options = query.options();
  // A Python entry point's call is recorded in its library's layout, which the replay's host path reads.
  pending.resident_wanted = !python_call && state->substituter->takes_resident(query);
  // A hooked op that returns the attention output alone is not run at all (substitute_hooked).
  const bool returns_one_tensor =
      schema && schema->returns().size() == 1 && schema->returns()[0].type()->kind() == c10::TypeKind::TensorType;
  pending.after_the_op = !(hooked && returns_one_tensor);
}

namespace {

std::string describe_failure(const std::exception& error) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
  return fmt::format("substitution failed: {}", c10_error ? c10_error->what_without_backtrace() : error.what());
}

// The kernel's output for a call judged its to take: on the op's tensors where it takes them there,
// else from the call's host copies (finished here, on the job's thread).
std::variant<at::Tensor, std::string> compute_substitute(PendingCall& pending, c10::IntArrayRef sizes,
                                                         const at::TensorOptions& options) {
  if (const auto& r = pending.resident) {
    return state->substituter->compute_resident(pending.call, r->q, r->k, r->v, r->mask, sizes, options);
  }
  pending.copies->finish_into(pending.call);
  return state->substituter->compute(pending.call, sizes, options);
}

}  // namespace

// Whatever holds the output (the job, the op's other outputs' consumers) sees the kernel's values.
void substitute_after_the_op(PendingCall& pending, c10::ArrayRef<c10::IValue> outputs) {
  try {
    at::RecordFunctionGuard no_observers(false);
    c10::AutoGradMode no_grad(false);
    const at::Tensor* found = pending.python_output ? &*pending.python_output : attention_output(outputs);
    if (!found) {
      pending.left_reason = "the op returned no attention output to replace";
      return;
    }
    at::Tensor output = *found;
    auto computed = compute_substitute(pending, output.sizes(), output.options());
    if (auto* reason = std::get_if<std::string>(&computed)) {
      pending.left_reason = std::move(*reason);
      return;
    }
    output.copy_(std::get<at::Tensor>(computed));
    pending.substituted = true;
  } catch (const std::exception& error) {
    pending.left_reason = describe_failure(error);
  }
}

// Where begin_call judged the call the kernel's to take and the kernel takes it; otherwise the op
// runs, and the reason is counted.
bool substitute_hooked(at::ObserverContext* context, const c10::FunctionSchema& schema, torch::jit::Stack* stack) {
  auto* pending = dynamic_cast<PendingCall*>(context);
  if (!pending || !pending->substitute || pending->after_the_op) return false;
  try {
    at::RecordFunctionGuard no_observers(false);
    c10::AutoGradMode no_grad(false);
    auto computed = compute_substitute(*pending, pending->output_sizes, pending->output_options);
    if (auto* reason = std::get_if<std::string>(&computed)) {
      pending->left_reason = std::move(*reason);
      return false;
    }
    torch::jit::drop(*stack, schema.arguments().size());
    torch::jit::push(*stack, std::move(std::get<at::Tensor>(computed)));
    pending->substituted = true;
    return true;
  } catch (const std::exception& error) {
    pending->left_reason = describe_failure(error);
    return false;
  }
}

}  // namespace attnreplay::capture
