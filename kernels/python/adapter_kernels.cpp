// The library adapters' kernels before their files are imported (python_host.h). `attnreplay
// kernels` lists them, and a run selects them, from attnreplay_adapters.py's reading of the files:
// importing an adapter imports its library, and with it torch and often CUDA libraries, seconds
// that a run spends beside its other kernels (on BackgroundPython's thread) and a listing spends not
// at all.
#include <fmt/format.h>

#include <atomic>
#include <map>
#include <memory>

#include "formats/errors.h"
#include "kernels/python/python_host.h"

namespace attnreplay {
namespace python_host __attribute__((visibility("hidden"))) {
namespace {

// One adapter file, imported once: on the background thread when a replay asks ahead, else on the
// thread whose kernel needs it now. Its fields other than `imported` change with the GIL held.
struct AdapterFile {
  std::string path;
  std::atomic<bool> requested{false}, imported{false};
  std::string error;  // why the import failed; empty when it did not

  // The GIL is held.
  void import_now() {
    if (imported) return;
    try {
      ensure_torch();
      interpreter().plugin.attr("_load")(path);
    } catch (py::error_already_set& error) {
      std::string line = error.what();
      try {
        line = interpreter().plugin.attr("_describe")(error.value(), error.trace()).cast<py::tuple>()[0].cast<std::string>();
      } catch (py::error_already_set&) {
      }
      this->error = fmt::format("{} does not load: {}", path, line);
    }
    imported = true;
  }

  void request() {
    if (imported || requested.exchange(true)) return;
    BackgroundPython::instance().post([this] { import_now(); });
  }
};

class AdapterKernel final : public Kernel, public ResidentKernel {
 public:
  AdapterKernel(KernelDescription description, std::shared_ptr<AdapterFile> file, bool compiles_ahead)
      : description_(std::move(description)), file_(std::move(file)), compiles_ahead_(compiles_ahead) {}

  const KernelDescription& description() const override { return description_; }
  std::optional<std::string> unsupported_reason(const AttentionCall&) const override {
    if (!runs_here()) return "no CUDA device";
    return std::nullopt;
  }
  std::unique_ptr<PreparedKernel> prepare(const AttentionCall& call, const KernelOptions& options) const override {
    return target().prepare(call, options);
  }
  at::Tensor run_resident(const AttentionCall& call, const ModelInputs& inputs,
                          const KernelOptions& options) const override {
    return target().run_resident(call, inputs, options);
  }
  // A GPU kernel where there is no GPU refuses every call: nothing to import for it.
  bool ready() const override {
    if (!runs_here()) return true;
    file_->request();
    return file_->imported && BackgroundPython::instance().idle();
  }
  void wait_until_ready() const override {
    if (!runs_here()) return;
    file_->request();
    BackgroundPython::instance().wait_idle();
  }
  bool compiles_ahead() const override { return compiles_ahead_; }
  // After the import, which the same thread runs first: the kernel's own compilations ahead.
  void expect_calls(const std::vector<AttentionCall>& headers, const KernelOptions& options) const override {
    if (!runs_here()) return;
    file_->request();
    BackgroundPython::instance().post([this, headers, options] {
      if (const PythonKernel* kernel = find_target()) kernel->expect_calls(headers, options);
    });
  }
  std::vector<AheadCompilation> ahead_compilations() const override {
    return target_ ? target_->ahead_compilations() : std::vector<AheadCompilation>{};
  }

 private:
  bool runs_here() const { return description_.device != "cuda" || have_cuda(); }

  // The kernel the imported adapter registered; null, with `unavailable_` set, where it did not.
  // The GIL is held.
  const PythonKernel* find_target() const {
    if (target_ || !unavailable_.empty()) return target_.get();
    file_->import_now();
    const py::object& plugin = interpreter().plugin;
    for (const auto& entry : plugin.attr("_entries")()) {
      const auto pair = entry.cast<py::tuple>();
      if (pair[0].attr("name").cast<std::string>() == description_.name) {
        target_ = std::make_unique<PythonKernel>(pair[0], pair[1].cast<std::string>());
        return target_.get();
      }
    }
    // Its library is installed, yet did not import (the adapter says why), or the file broke.
    for (const auto& item : plugin.attr("_unavailable_kernels")()) {
      const auto [name, reason] = item.cast<std::pair<std::string, std::string>>();
      if (name == description_.name) unavailable_ = reason;
    }
    if (unavailable_.empty()) {
      unavailable_ = file_->error.empty() ? fmt::format("{} did not register it", file_->path) : file_->error;
    }
    return nullptr;
  }

  // Imports now where the background thread has not (waiting for it first, so that nothing is
  // imported twice), as a call needs the kernel.
  const PythonKernel& target() const {
    BackgroundPython::instance().wait_idle();
    py::gil_scoped_acquire gil;
    if (const PythonKernel* kernel = find_target()) return *kernel;
    throw KernelNotSupported(fmt::format("its library does not load here: {}", unavailable_));
  }

  KernelDescription description_;
  std::shared_ptr<AdapterFile> file_;
  bool compiles_ahead_;  // its class defines precompile()
  mutable std::unique_ptr<PythonKernel> target_;
  mutable std::string unavailable_;
};

}  // namespace

void register_adapter_kernels(Interpreter& it, std::vector<std::string>& errors) {
  py::object described;
  try {
    described = py::module_::import("attnreplay_adapters").attr("describe_adapters")(it.dirs.adapters);
  } catch (py::error_already_set& error) {
    it.broken_adapters.emplace_back("(library adapters)", error.what());
    return;
  }
  std::map<std::string, std::shared_ptr<AdapterFile>> files;
  const py::object reason_of = py::module_::import("attnreplay_adapters").attr("unavailable_reason");
  for (const auto& kernel : described.cast<py::tuple>()[0]) {
    const auto name = kernel["name"].cast<std::string>();
    const py::object reason = reason_of(kernel);
    if (!reason.is_none()) {
      it.not_installed.emplace_back(name, reason.cast<std::string>());
      continue;
    }
    const auto path = kernel["file"].cast<std::string>();
    auto& file = files[path];
    if (!file) {
      file = std::make_shared<AdapterFile>();
      file->path = path;
    }
    KernelDescription d;
    try {
      d.extensions = extensions_named(kernel["extensions"].cast<std::vector<std::string>>(), path, name);
    } catch (const InputError& error) {
      errors.push_back(error.what());
      continue;
    }
    d.name = name;
    d.summary = kernel["summary"].cast<std::string>();
    d.device = kernel["device"].cast<std::string>();
    d.ragged = d.paged = kernel["layout"].cast<std::string>() == "thd";
    d.headline = headline_named(kernel["headline"].cast<std::string>()).value_or(KernelDescription::Headline::kernel);
    if (!kernel["reduced_precision"].is_none()) d.reduced_precision = parse_dtype(kernel["reduced_precision"].cast<std::string>());
    it.adapter_files.insert(path);
    it.registered.insert(name);
    KernelRegistry::SourceScope scope(path);
    KernelRegistry::instance().add(std::make_unique<AdapterKernel>(std::move(d), file, kernel["precompiles"].cast<bool>()));
  }
  for (const auto& problem : described.cast<py::tuple>()[1]) {
    const auto pair = problem.cast<std::pair<std::string, std::string>>();
    it.broken_adapters.emplace_back(pair.first, pair.first + ": " + pair.second);
  }
  for (std::string& error : KernelRegistry::instance().take_rejected()) errors.push_back(std::move(error));
}

}  // namespace python_host
}  // namespace attnreplay
