// The calls of Python entry points (FlashInfer's wrappers, flash_attn_with_kvcache:
// python_entry_points.py), handed over through two ops of capture's own (observation.h).
#include <ATen/SequenceNumber.h>
#include <torch/library.h>

#include <chrono>

#include "capture/observation.h"

namespace attnreplay::capture {
namespace {

// A Python entry point's call is selected first (attncap::select_python_call), so that the Python
// side describes only the calls recorded or, under ATTNCAP_SUBSTITUTE, to be substituted;
// attncap::python_call then takes the one selected on its thread.
thread_local std::optional<Selection> python_selection;

// attncap::select_python_call's kernel: counts the call, and says whether the Python side is to
// describe it.
void select_python_call_kernel(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  const std::string name = stack->back().toStringRef();
  torch::jit::drop(*stack, 1);
  python_selection.reset();
  bool wanted = false;
  if (state && op_wanted(name)) {
    try {
      // Under substitution every call is described, recorded or not: the kernel may take it.
      const Selection selection = select_call();
      if (selection.wanted || state->substituter) python_selection = selection;
      wanted = python_selection.has_value();
    } catch (const std::exception& error) {
      count_failed();
      report_failure_once(error);
    }
  }
  torch::jit::push(*stack, wanted);
}

// attncap::python_call's kernel: the call selected, under the entry point's own name, is recorded
// and substituted as a matched op's would be (it has run already: its output is the `out` given).
void python_call_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const std::size_t count = schema.arguments().size();
  const c10::ArrayRef<c10::IValue> inputs(stack->data() + stack->size() - count, count);
  const std::optional<Selection> selection = python_selection;
  python_selection.reset();
  if (state && selection && inputs[0].isString()) {
    auto context = begin_call(inputs[0].toStringRef(), &schema, inputs,
                              static_cast<std::int64_t>(at::sequence_number::peek()), /*hooked=*/false, selection);
    // duration_s is the entry point's own wall time, as the Python side measured it, plus the copies.
    const c10::IValue* wall = find_input(call_arguments(&schema, inputs).named, {"wall_s"});
    if (auto* pending = dynamic_cast<PendingCall*>(context.get()); pending && wall && wall->isDouble()) {
      pending->started -= std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(wall->toDouble()));
    }
    const c10::ArrayRef<c10::IValue> no_outputs;
    end_call(context.get(), &no_outputs);
  }
  torch::jit::drop(*stack, count);
}

}  // namespace

// Done at start, not when the part loads, so that nothing of it can fail inside dlopen.
// python_call's arguments after `out` are flash-attn's names for what the record holds
// (FlashInfer's for its paged form).
void define_python_call_ops() {
  static auto* library = new torch::Library(torch::Library::DEF, "attncap", std::nullopt, __FILE__, __LINE__);
  library->def("select_python_call(str op) -> bool",
               torch::dispatch(c10::DispatchKey::CompositeExplicitAutograd,
                               torch::CppFunction::makeFromBoxedFunction<&select_python_call_kernel>()));
  library->def("python_call(str op, Tensor q, Tensor k, Tensor v, Tensor out, *, Tensor? cu_seqlens_q=None, "
               "Tensor? cu_seqlens_k=None, Tensor? seqused_k=None, Tensor? block_table=None, "
               "Tensor? paged_kv_indptr=None, Tensor? paged_kv_indices=None, Tensor? paged_kv_last_page_len=None, "
               "Tensor? alibi_slopes=None, Tensor? sinks=None, float? softmax_scale=None, bool causal=False, "
               "int window_size_left=-1, int window_size_right=-1, float softcap=0., float wall_s=0., "
               "str[] argument_names, str[] argument_values) -> ()",
               torch::dispatch(c10::DispatchKey::CompositeExplicitAutograd,
                               torch::CppFunction::makeFromBoxedFunction<&python_call_kernel>()));
}

}  // namespace attnreplay::capture
