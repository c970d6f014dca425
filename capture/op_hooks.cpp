#include "capture/op_hooks.h"

#include <c10/util/Exception.h>
#include <torch/library.h>
#include <torch/version.h>

#include <atomic>
#include <map>
#include <optional>

// An op's kernel can be read out of the dispatcher (OperatorHandle::getComputedKernelForDispatchKey)
// from torch 2.9 on; before, no hook can call the kernel it would stand in front of.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
#define ATTNCAP_OP_HOOKS 1
#endif

namespace attnreplay::capture {

bool op_hooks_supported() {
#ifdef ATTNCAP_OP_HOOKS
  return true;
#else
  return false;
#endif
}

namespace {

using c10::DispatchKey;

#ifdef ATTNCAP_OP_HOOKS
// The hook kernel: holds the kernel it stands in front of and calls it with the same stack.
class HookKernel final : public c10::OperatorKernel {
 public:
  HookKernel(std::string name, c10::SafeKernelFunction original, HookCallbacks callbacks)
      : name_(std::move(name)), original_(std::move(original)), callbacks_(callbacks) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    const std::size_t n_inputs = schema.arguments().size();
    auto context =
        callbacks_.begin(name_, schema, c10::ArrayRef<c10::IValue>(stack->data() + stack->size() - n_inputs, n_inputs));
    try {
      if (!callbacks_.substitute || !callbacks_.substitute(context.get(), schema, stack)) {
        original_.callBoxed(op, keys, stack);
      }
    } catch (...) {
      callbacks_.end(context.get(), nullptr);
      throw;
    }
    const std::size_t n_outputs = std::min(schema.returns().size(), stack->size());
    const c10::ArrayRef<c10::IValue> outputs(stack->data() + stack->size() - n_outputs, n_outputs);
    callbacks_.end(context.get(), &outputs);
  }

 private:
  std::string name_;
  c10::SafeKernelFunction original_;
  HookCallbacks callbacks_;
};

// Swallows the dispatcher's "Overriding a previously registered kernel" warning while hooks are
// put in: the override is the point, and the job's stderr should not change.
class SilentWarnings final : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

// Device keys whose kernels see real tensors. Meta (and the fake tensors of torch.compile) is left
// alone; nested-tensor and sparse keys are not attention inputs we can record.
constexpr DispatchKey kDeviceKeys[] = {DispatchKey::CPU, DispatchKey::CUDA, DispatchKey::HIP, DispatchKey::XPU,
                                       DispatchKey::MPS, DispatchKey::PrivateUse1};
constexpr DispatchKey kCompositeKeys[] = {DispatchKey::CompositeImplicitAutograd, DispatchKey::CompositeExplicitAutograd,
                                          DispatchKey::CompositeExplicitAutogradNonFunctional};

// The kernel a composite registration fills a device key with: read from a device key that has no
// kernel of its own, since alias keys have no runtime kernel to read.
std::optional<c10::SafeKernelFunction> composite_kernel(const c10::OperatorHandle& op) {
  for (DispatchKey key : kDeviceKeys) {
    if (!op.hasKernelForDispatchKey(key) && op.hasComputedKernelForDispatchKey(key)) {
      return op.getComputedKernelForDispatchKey(key);
    }
  }
  return std::nullopt;
}

std::string qualified_name(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

// One Library per (namespace, key), kept for the life of the process: destroying it would take the
// hooks out again.
torch::Library& library_for(const std::string& ns, DispatchKey key) {
  static std::map<std::pair<std::string, DispatchKey>, std::unique_ptr<torch::Library>> libraries;
  auto& library = libraries[{ns, key}];
  if (!library) library = std::make_unique<torch::Library>(torch::Library::IMPL, ns, key, __FILE__, __LINE__);
  return *library;
}

void hook(const c10::OperatorHandle& op, DispatchKey key, c10::SafeKernelFunction original, HookCallbacks callbacks,
          std::vector<HookedOp>& hooked) {
  const auto& name = op.operator_name();
  const auto separator = name.name.find("::");
  const std::string ns = name.name.substr(0, separator);
  const std::string unqualified = qualified_name(name).substr(separator + 2);
  library_for(ns, key).impl(unqualified.c_str(), torch::CppFunction::makeFromBoxedFunctor(
                                                     std::make_unique<HookKernel>(name.name, std::move(original), callbacks)));
  hooked.push_back({name.name, name.overload_name, c10::toString(key)});
}

#endif  // ATTNCAP_OP_HOOKS

class NewOpListener final : public c10::OpRegistrationListener {
 public:
  explicit NewOpListener(std::function<void(const std::string&)> on_new_op) : on_new_op_(std::move(on_new_op)) {}
  void onOperatorRegistered(const c10::OperatorHandle& op) override {
    if (replaying_existing) return;
    try {
      on_new_op_(op.operator_name().name);
    } catch (...) {
      // A listener must not throw into whoever registers the op.
    }
  }
  void onOperatorDeregistered(const c10::OperatorHandle&) override {}
  std::atomic<bool> replaying_existing{true};

 private:
  std::function<void(const std::string&)> on_new_op_;
};

}  // namespace

std::vector<HookedOp> install_op_hooks(const std::function<bool(const std::string&)>& wanted, HookCallbacks callbacks) {
  std::vector<HookedOp> hooked;
#ifndef ATTNCAP_OP_HOOKS
  (void)wanted, (void)callbacks;
  return hooked;
#else
  SilentWarnings silent;
  c10::WarningUtils::WarningHandlerGuard quiet(&silent);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (!wanted(name.name)) continue;
    const auto op = dispatcher.findOp(name);
    if (!op || !op->hasSchema()) continue;
    // A composite op is hooked at its alias key: a device-key kernel would take autograd's place.
    std::optional<DispatchKey> composite;
    for (DispatchKey key : kCompositeKeys) {
      if (op->hasKernelForDispatchKey(key)) {
        composite = key;
        break;
      }
    }
    if (composite) {
      if (auto original = composite_kernel(*op)) hook(*op, *composite, std::move(*original), callbacks, hooked);
    }
    for (DispatchKey key : kDeviceKeys) {
      if (op->hasKernelForDispatchKey(key)) hook(*op, key, op->getComputedKernelForDispatchKey(key), callbacks, hooked);
    }
  }
  return hooked;
#endif
}

void watch_new_ops(std::function<void(const std::string&)> on_new_op) {
  auto listener = std::make_unique<NewOpListener>(std::move(on_new_op));
  NewOpListener* raw = listener.get();
  // The dispatcher replays every registered op to a new listener; those are not new.
  static auto* handle = new c10::RegistrationHandleRAII(c10::Dispatcher::singleton().addRegistrationListener(std::move(listener)));
  (void)handle;
  raw->replaying_existing = false;
}

}  // namespace attnreplay::capture
