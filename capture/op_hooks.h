// Per-op hooks: a boxed kernel put in front of the kernel an op already has, which tells the
// observer about the call and then runs that kernel unchanged (or, under kernel substitution,
// lets the observer give the op's outputs in its place).
//
// Why not a global RecordFunction callback for everything: it makes the dispatcher box the
// arguments of every op the job runs (about +0.3 us per op, a few percent of a model step), while
// a hook costs nothing to ops it is not on. RecordFunction stays for ops registered after capture
// starts (flash-attn, SageAttention, xformers register theirs when imported): their kernels are
// not in place yet when the dispatcher announces them.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace attnreplay::capture {

struct HookCallbacks {
  // Called before the op's own kernel, with its arguments as the caller passed them.
  std::unique_ptr<at::ObserverContext> (*begin)(const std::string& op, const c10::FunctionSchema& schema,
                                                c10::ArrayRef<c10::IValue> inputs) = nullptr;
  // Called after it; `outputs` is null when the kernel threw (the exception goes on to the job).
  void (*end)(at::ObserverContext* context, const c10::ArrayRef<c10::IValue>* outputs) = nullptr;
  // Called between the two, where set (kernel substitution): true when it has replaced the op's
  // inputs on the stack by the op's outputs computed otherwise, so that the op's kernel is not run.
  bool (*substitute)(at::ObserverContext* context, const c10::FunctionSchema& schema, torch::jit::Stack* stack) = nullptr;
};

struct HookedOp {
  std::string op;            // "aten::scaled_dot_product_attention"
  std::string overload;      // often empty
  std::string dispatch_key;  // where the hook sits, e.g. "CompositeImplicitAutograd" or "CUDA"
};

// Whether this torch lets a hook call the kernel it stands in front of (torch 2.9 on). Without,
// install_op_hooks hooks nothing and every matched op is observed through RecordFunction.
bool op_hooks_supported();

// Hooks every registered op whose name `wanted` accepts (names without overload, as RecordFunction
// reports them). Each overload is hooked where its real-tensor kernels are: a composite op at its
// alias key (so autograd still sees the decomposition), other ops at each device key with a kernel
// (CPU, CUDA, ...), never at Meta, so compile-time fake tensors mostly never reach a hook.
std::vector<HookedOp> install_op_hooks(const std::function<bool(const std::string&)>& wanted, HookCallbacks callbacks);

// Calls `on_new_op` with the name of each op registered from now on (never for those already
// registered). It runs with the dispatcher's registration lock held: it must not register anything.
void watch_new_ops(std::function<void(const std::string&)> on_new_op);

}  // namespace attnreplay::capture
