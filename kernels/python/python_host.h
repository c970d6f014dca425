#pragma once
// What the Python plug-in host's files share (kernels/python/): the embedded interpreter, the
// Kernel that runs a Python kernel object, and the thread that does Python work beside the replay.
// Internal to kernels/python/; the rest of attnreplay uses python_kernels.h.
#include <torch/csrc/utils/pybind.h>

#include <ATen/ATen.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/kernel.h"
#include "kernels/resident_kernel.h"

namespace attnreplay {
// Hidden, as pybind11's types are: what holds them may not be seen further than they are.
namespace python_host __attribute__((visibility("hidden"))) {

namespace py = pybind11;

// Where attnreplay_plugin.py and the adapters are: beside an installed binary, else the source tree
// it was built from.
struct PythonDirs {
  std::string api, adapters;
};

struct Interpreter {
  std::string error;    // why Python is not running; empty when it is
  py::object plugin;    // the attnreplay_plugin module
  PythonDirs dirs;
  bool torch_imported = false;
  bool adapters_loaded = false;
  bool ours = false;    // started by this process, not a Python job's own (kernel substitution)
  // Adapters that broke for a reason other than their package's absence (which the plug-in API
  // records itself), or Python not starting: (name, reason).
  std::vector<std::pair<std::string, std::string>> broken_adapters;
  // Kernels the adapters offer whose libraries are not installed, read without importing: (name, reason).
  std::vector<std::pair<std::string, std::string>> not_installed;
  std::set<std::string> registered;     // Python kernels already in the registry
  std::set<std::string> adapter_files;  // adapters whose kernels are registered as AdapterKernels
};

// Started on first use, never finalized: kernels in the registry hold Python objects until the
// process ends. Starting it imports no torch.
Interpreter& interpreter();
// Imports torch into the interpreter once, before any tensor crosses; the GIL is held.
void ensure_torch();

// A Python exception as a failed row (KernelFailure), or for attnreplay_plugin.NotSupported, the
// kernel's no (KernelNotSupported). The GIL is held.
[[noreturn]] void throw_failure(py::error_already_set& error, std::string_view during);

bool have_cuda();

// A kernel's `headline` attribute ("kernel", "call" or "run") as the description holds it;
// nullopt for any other text.
std::optional<KernelDescription::Headline> headline_named(const std::string& text);

// A kernel's `extensions` attribute ("window", "softcap", "alibi", "sinks") as the description
// holds it; an InputError naming `source`, the kernel and the unknown name for any other.
Extensions extensions_named(const std::vector<std::string>& names, const std::string& source,
                            const std::string& kernel);

// Python work on a thread of attnreplay's own, beside the replay of other kernels: importing the
// libraries a run selected and compiling ahead. Its thread runs at a lower priority, so that the
// replay's timing thread is not delayed by it, nor by the compiler processes it starts (which
// inherit that priority). A Python kernel is ready() only while it is idle: timing one while this
// holds the GIL would time the wait for it.
class BackgroundPython {
 public:
  static BackgroundPython& instance();
  // Queues `task`, run with the GIL held; an exception it throws is its own to report.
  void post(std::function<void()> task);
  bool idle() const;
  void wait_idle() const;

 private:
  void loop();
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  std::deque<std::function<void()>> tasks_;
  bool running_ = false;
  bool started_ = false;
  int gpu_ = -1;  // the GPU of the thread that first posted, made current on this one
};

// A kernel written in Python, as the registry holds it.
class PythonKernel final : public Kernel, public ResidentKernel {
 public:
  PythonKernel(py::object kernel, const std::string& source);
  ~PythonKernel() override;

  const KernelDescription& description() const override { return description_; }
  std::optional<std::string> unsupported_reason(const AttentionCall& call) const override;
  std::unique_ptr<PreparedKernel> prepare(const AttentionCall& call, const KernelOptions& options) const override;
  at::Tensor run_resident(const AttentionCall& call, const ModelInputs& inputs,
                          const KernelOptions& options) const override;
  bool ready() const override { return BackgroundPython::instance().idle(); }
  void wait_until_ready() const override { BackgroundPython::instance().wait_idle(); }
  bool compiles_ahead() const override { return compiles_ahead_; }
  void expect_calls(const std::vector<AttentionCall>& headers, const KernelOptions& options) const override;
  std::vector<AheadCompilation> ahead_compilations() const override;

  const py::object& object() const { return kernel_; }

 private:
  py::object kernel_;
  KernelDescription description_;
  bool compiles_ahead_ = false;  // it defines precompile()
  mutable std::mutex compilations_mutex_;
  mutable std::vector<AheadCompilation> compilations_;
};

// The adapters' kernels as the registry holds them before their files are imported
// (adapter_kernels.cpp): from attnreplay_adapters.py's reading of the files. Adds those whose
// libraries are installed and records the others in `it.not_installed`. The GIL is held.
void register_adapter_kernels(Interpreter& it, std::vector<std::string>& errors);

}  // namespace python_host
}  // namespace attnreplay
