// Python plug-in kernels (docs/plugins.md). The interpreter is embedded rather than attnreplay
// being an extension module of it, so that `attnreplay` stays one program whatever the kernels:
// the interpreter starts only when a Python kernel is asked for, imports the torch whose libtorch
// this program already runs on, and from then on a Python kernel is handed the very tensors,
// CUDA context and current stream that the built-in kernels use. Nothing crosses a process.
// Kernel substitution builds the same code into a Python job (capture/substitution_kernels.cpp),
// where it runs in the job's own interpreter.
#include "kernels/python/python_kernels.h"

#include <torch/csrc/utils/pybind.h>

#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <set>

#include "formats/errors.h"
#include "formats/torch_tensor.h"
#include "kernels/device_output.h"
#include "kernels/kernel.h"
#include "kernels/python/python_host.h"
#include "kernels/quantized_attention.h"
#include "kernels/torch_inputs.h"

namespace attnreplay {
namespace python_host __attribute__((visibility("hidden"))) {
namespace {
namespace fs = std::filesystem;

PythonDirs python_dirs() {
  std::error_code error;
  const fs::path exe = fs::read_symlink("/proc/self/exe", error);
  if (!error) {
    const fs::path share = exe.parent_path().parent_path() / "share" / "attnreplay";
    if (fs::exists(share / "python" / "attnreplay_plugin.py")) {
      return {(share / "python").string(), (share / "adapters").string()};
    }
  }
  return {ATTNREPLAY_SOURCE_DIR "/kernels/python", ATTNREPLAY_SOURCE_DIR "/kernels/adapters"};
}

std::string python_executable() {
  const char* chosen = std::getenv("ATTNREPLAY_PYTHON");
  return chosen && *chosen ? chosen : ATTNREPLAY_PYTHON_EXECUTABLE;
}

// attnreplay_plugin, imported with the GIL held; torch waits for ensure_torch().
void import_plugin_api(Interpreter& it) {
  py::module_::import("sys").attr("path").attr("insert")(0, it.dirs.api);
  it.plugin = py::module_::import("attnreplay_plugin");
}

void start(Interpreter& it) {
  it.dirs = python_dirs();
  // Inside a Python job (kernel substitution, capture/substitution.h): its interpreter, its torch
  // (the one this code was built for, or it would not have been loaded), and its GIL.
  if (Py_IsInitialized()) {
    py::gil_scoped_acquire gil;
    try {
      import_plugin_api(it);
    } catch (py::error_already_set& error) {
      it.error = fmt::format("the job's Python could not import attnreplay's plug-in API: {}", error.what());
    }
    return;
  }
  const std::string python = python_executable();
  PyConfig config;
  PyConfig_InitPythonConfig(&config);
  config.parse_argv = 0;
  config.install_signal_handlers = 0;  // Ctrl-C stays attnreplay's
  // The interpreter finds its prefix and the venv's site-packages from this path, as the
  // executable itself would.
  PyStatus status = PyConfig_SetBytesString(&config, &config.program_name, python.c_str());
  char program[] = "attnreplay";
  char* argv[] = {program};
  if (!PyStatus_Exception(status)) status = PyConfig_SetBytesArgv(&config, 1, argv);
  if (!PyStatus_Exception(status)) status = Py_InitializeFromConfig(&config);
  PyConfig_Clear(&config);
  if (PyStatus_Exception(status)) {
    it.error = fmt::format("Python ({}) did not start: {}", python, status.err_msg ? status.err_msg : "unknown error");
    return;
  }
  it.ours = true;
  try {
    // Its torch must be the one this program links: another version's Python part on this
    // libtorch would not even fail cleanly.
    const std::string torch_version =
        py::module_::import("importlib.metadata").attr("version")("torch").cast<std::string>();
    if (torch_version != ATTNREPLAY_TORCH_VERSION) {
      it.error = fmt::format("the Python at {} has torch {}, but attnreplay was built with torch {} "
                             "(set ATTNREPLAY_PYTHON to a Python with that torch)",
                             python, torch_version, ATTNREPLAY_TORCH_VERSION);
    } else {
      import_plugin_api(it);
    }
  } catch (py::error_already_set& error) {
    it.error = fmt::format("Python ({}) started, but {}", python, error.what());
  }
  // The GIL is taken for each call into Python, so that Python's own threads run meanwhile.
  PyEval_SaveThread();
}

std::atomic<Interpreter*> started_interpreter{nullptr};

}  // namespace

Interpreter& interpreter() {
  static Interpreter* it = [] {
    auto* started = new Interpreter;
    start(*started);
    started_interpreter = started;
    return started;
  }();
  return *it;
}

void ensure_torch() {
  Interpreter& it = interpreter();
  if (it.torch_imported) return;
  py::module_::import("torch");
  it.torch_imported = true;
}

[[noreturn]] void throw_failure(py::error_already_set& error, std::string_view during) {
  if (error.matches(interpreter().plugin.attr("NotSupported"))) {
    throw KernelNotSupported(py::str(error.value()).cast<std::string>());
  }
  std::string line = error.what(), traceback;
  try {
    py::tuple described = interpreter().plugin.attr("_describe")(error.value(), error.trace());
    line = described[0].cast<std::string>();
    traceback = described[1].cast<std::string>();
  } catch (py::error_already_set&) {
  }
  throw KernelFailure(fmt::format("{}: {}", during, line), traceback);
}

bool have_cuda() { return at::detail::getCUDAHooks().hasCUDA(); }

std::optional<KernelDescription::Headline> headline_named(const std::string& text) {
  using Headline = KernelDescription::Headline;
  if (text == "kernel") return Headline::kernel;
  if (text == "call") return Headline::whole_call;
  if (text == "run") return Headline::run_is_call;
  return std::nullopt;
}

Extensions extensions_named(const std::vector<std::string>& names, const std::string& source,
                            const std::string& kernel) {
  Extensions extensions;
  for (const std::string& name : names) {
    bool* flag = name == "window"    ? &extensions.window
                 : name == "softcap" ? &extensions.softcap
                 : name == "alibi"   ? &extensions.alibi
                 : name == "sinks"   ? &extensions.sinks
                                     : nullptr;
    if (!flag) {
      throw InputError(fmt::format("{}: kernel '{}': extension '{}' is not one of \"window\", \"softcap\", "
                                   "\"alibi\", \"sinks\"",
                                   source, kernel, name));
    }
    *flag = true;
  }
  return extensions;
}

namespace {

// The call's ALiBi slopes and sinks, on the kernel's device as the record holds them, for Inputs;
// absent ones are None. Only a kernel that declares them gets this far (missing_extensions).
void add_extension_tensors(py::dict& batch, const AttentionCall& call, at::Device device) {
  for (const auto& [name, field] : {std::pair{"alibi_slopes", &call.alibi_slopes}, {"sinks", &call.sinks}}) {
    batch[name] = *field ? py::cast(device_copy(**field, device).clone()) : py::none();
  }
}

// A ragged call's q, k and v as stored, (total, heads, dim) or pages, the plug-in's own copies; and
// its offsets, counts and block table as the varlen libraries take them (int32, on the device). A
// kernel that reads no block table (`reads_pages` false) gets a paged call's keys packed.
std::pair<ModelInputs, py::dict> ragged_inputs(const AttentionCall& call, at::Device device, bool reads_pages) {
  ModelInputs in{device_copy(call.q, device).clone(), device_copy(call.k, device).clone(),
                 device_copy(call.v, device).clone(), std::nullopt};
  py::dict batch;
  for (const auto& [name, field] : {std::pair{"cu_seqlens_q", &call.cu_seqlens_q}, {"cu_seqlens_k", &call.cu_seqlens_k},
                                    {"seqused_k", &call.seqused_k}, {"block_table", &call.block_table}}) {
    batch[name] = *field ? py::cast(device_copy(**field, device).to(at::kInt)) : py::none();
  }
  if (call.is_paged() && !reads_pages) {
    const PackedKeyRows keys = packed_key_rows(call, device);
    in.k = in.k.flatten(0, 1).index_select(0, keys.rows);
    in.v = in.v.flatten(0, 1).index_select(0, keys.rows);
    batch["cu_seqlens_k"] = keys.cu_seqlens_k;
    batch["seqused_k"] = py::none();
    batch["block_table"] = py::none();
  }
  return {std::move(in), std::move(batch)};
}

py::dict spec_fields(const AttentionCall& call, const QuantOptions& quant) {
  const AttentionShape s = call.shape();
  py::dict fields;
  fields["index"] = call.call_index;
  fields["op"] = call.op;
  fields["dtype"] = std::string(dtype_name(call.q.dtype));
  fields["model_layout"] = std::string(layout_name(call.layout));
  fields["batch"] = s.batch;
  fields["heads_q"] = s.heads_q;
  fields["heads_kv"] = s.heads_kv;
  fields["seq_q"] = s.seq_q;
  fields["seq_kv"] = s.seq_kv;
  fields["head_dim_qk"] = s.head_dim_qk;
  fields["head_dim_vo"] = s.head_dim_vo;
  fields["is_causal"] = call.is_causal;
  fields["causal_alignment"] = std::string(causal_alignment_name(call.causal_alignment));
  fields["scale"] = call.softmax_scale();
  fields["mask_kind"] = call.mask ? py::cast(call.mask->dtype == DType::boolean ? "bool" : "float") : py::none();
  fields["mask_shape"] = call.mask ? py::cast(call.mask->shape) : py::none();
  fields["metadata"] = call.metadata;
  fields["window_left"] = call.window_left ? py::cast(*call.window_left) : py::none();
  fields["window_right"] = call.window_right ? py::cast(*call.window_right) : py::none();
  fields["softcap"] = call.softcap;
  fields["alibi_shape"] = call.alibi_slopes ? py::cast(call.alibi_slopes->shape) : py::none();
  fields["sinks_shape"] = call.sinks ? py::cast(call.sinks->shape) : py::none();
  if (call.is_ragged()) {
    std::vector<std::int64_t> q_lens, k_lens;
    for (const auto& sequence : call.sequences()) q_lens.push_back(sequence.q_len), k_lens.push_back(sequence.k_len);
    fields["q_lens"] = py::tuple(py::cast(q_lens));
    fields["k_lens"] = py::tuple(py::cast(k_lens));
    fields["page_size"] = call.is_paged() ? call.k.shape[1] : 0;
  }
  py::dict q;
  q["quant_gran"] = std::string(to_string(quant.quant_gran));
  q["k_smooth"] = quant.k_smooth;
  q["pv_accum_dtype"] = std::string(to_string(quant.pv_accum));
  q["fp8_scale"] = std::string(to_string(quant.fp8_scale));
  fields["quant"] = q;
  return fields;
}

// The call as `kernel` sees it (a CallSpec), once the kernel has said it takes it; its refusal, in
// its words, as KernelNotSupported. The GIL is held.
py::object accepted_spec(const py::object& kernel, const AttentionCall& call, const QuantOptions& quant) {
  py::object spec;
  try {
    spec = interpreter().plugin.attr("_make_spec")(kernel, spec_fields(call, quant));
  } catch (py::error_already_set& error) {
    throw_failure(error, "describing the call");
  }
  py::object reason;
  try {
    reason = kernel.attr("decline_reason")(spec);
  } catch (py::error_already_set& error) {
    throw_failure(error, "supports()");
  }
  if (!reason.is_none()) throw KernelNotSupported(py::str(reason).cast<std::string>());
  return spec;
}

class PythonPrepared final : public PreparedKernel, public DeviceOutput {
 public:
  PythonPrepared(const PythonKernel& kernel, const AttentionCall& call, const KernelOptions& options)
      : on_gpu_(kernel.description().device == "cuda") {
    c10::AutoGradMode no_grad(false);
    py::gil_scoped_acquire gil;
    try {
      bind(kernel, call, options);
    } catch (...) {
      // Members outlive `gil` while the exception unwinds: drop them while it is held.
      run_ = py::object();
      prepared_ = py::object();
      throw;
    }
  }

  ~PythonPrepared() override {
    py::gil_scoped_acquire gil;
    run_ = py::object();
    prepared_ = py::object();
  }

  void run() override {
    c10::AutoGradMode no_grad(false);
    py::gil_scoped_acquire gil;
    run_locked();
  }
  bool has_preparation() const override { return has_preparation_; }
  double compile_seconds() const override { return compile_s_; }
  void prepare_inputs() override {
    c10::AutoGradMode no_grad(false);
    py::gil_scoped_acquire gil;
    try {
      prepared_.attr("prepare_inputs")();
    } catch (py::error_already_set& error) {
      throw_failure(error, "prepare()");
    }
  }
  void synchronize() override {
    if (on_gpu_) at::detail::getCUDAHooks().deviceSynchronize(current_gpu().index());
  }
  // torch's ops and Triton's launches queue on torch's current stream.
  bool runs_on_current_stream() const override { return on_gpu_; }
  HostTensor output() override { return host_tensor_from_torch(device_output()); }
  at::Tensor device_output() override {
    py::gil_scoped_acquire gil;
    throw_if_problem();
    try {
      return prepared_.attr("output_bhsd")().cast<at::Tensor>();
    } catch (py::error_already_set& error) {
      throw_failure(error, "reading the output");
    }
  }

 private:
  void bind(const PythonKernel& kernel, const AttentionCall& call, const KernelOptions& options) {
    ensure_torch();
    const py::object& plugin = interpreter().plugin;
    const py::object spec = accepted_spec(kernel.object(), call, options.quant);
    has_preparation_ = kernel.object().attr("has_preparation")().cast<bool>();
    // The plug-in's own copies: it may write into them (problem() catches that and restores them).
    const at::Device device = on_gpu_ ? current_gpu() : at::Device(at::kCPU);
    auto [in, batch] = call.is_ragged()
                           ? ragged_inputs(call, device, kernel.object().attr("paged").cast<bool>())
                           : std::pair{model_inputs(call, device, /*writable=*/true), py::dict()};
    add_extension_tensors(batch, call, device);
    try {
      prepared_ = plugin.attr("_Prepared")(kernel.object(), spec, in.q, in.k, in.v,
                                           in.mask ? py::cast(*in.mask) : py::none(), batch);
    } catch (py::error_already_set& error) {
      throw_failure(error, has_preparation_ ? "prepare()" : "setting up the inputs");
    }
    run_ = prepared_.attr("run");
    compile_s_ = prepared_.attr("compile_s").cast<double>();
    // One checked run before any timing: a broken plug-in fails here, not after its samples.
    run_locked();
    if (on_gpu_) at::detail::getCUDAHooks().deviceSynchronize(current_gpu().index());
    throw_if_problem();
  }

  void run_locked() {
    try {
      run_();
    } catch (py::error_already_set& error) {
      throw_failure(error, "run()");
    }
  }
  // A wrong output, or inputs the kernel wrote into (put back, so nothing after sees them).
  void throw_if_problem() {
    py::object problem;
    try {
      problem = prepared_.attr("problem")();
    } catch (py::error_already_set& error) {
      throw_failure(error, "checking the output");
    }
    if (problem.is_none()) return;
    const std::string reason = py::str(problem).cast<std::string>();
    prepared_.attr("restore_inputs")();
    throw KernelFailure(reason, "");
  }

  bool on_gpu_;
  bool has_preparation_ = false;
  double compile_s_ = 0;
  py::object prepared_;
  py::object run_;  // prepared_.run, looked up once
};

}  // namespace

PythonKernel::PythonKernel(py::object kernel, const std::string& source) : kernel_(std::move(kernel)) {
  description_.name = kernel_.attr("name").cast<std::string>();
  const std::string summary = py::str(kernel_.attr("summary")).cast<std::string>();
  description_.summary = summary.empty() ? "Python plug-in kernel" : summary;
  description_.device = kernel_.attr("device").cast<std::string>();
  // A kernel of layout "thd" takes ragged batches as one, paged ones too: one that reads no block
  // table gets the pages gathered (ragged_inputs). The others get them sequence by sequence.
  description_.ragged = description_.paged = kernel_.attr("layout").cast<std::string>() == "thd";
  compiles_ahead_ = py::hasattr(kernel_, "precompile");
  const std::string headline = py::getattr(kernel_, "headline", py::str("kernel")).cast<std::string>();
  const auto named = headline_named(headline);
  if (!named) {
    throw InputError(fmt::format("{}: kernel '{}': headline '{}' is not \"kernel\", \"call\" or \"run\"", source,
                                 description_.name, headline));
  }
  description_.headline = *named;
  description_.extensions = extensions_named(
      py::getattr(kernel_, "extensions", py::tuple()).cast<std::vector<std::string>>(), source, description_.name);
  const py::object reduced = kernel_.attr("reduced_precision");
  if (!reduced.is_none()) {
    const std::string name = reduced.cast<std::string>();
    description_.reduced_precision = parse_dtype(name);
    if (!description_.reduced_precision) {
      throw InputError(fmt::format("{}: kernel '{}': reduced_precision '{}' is not a dtype", source,
                                   description_.name, name));
    }
  }
}

// The interpreter outlives static destruction unfinalized; the reference is left to it.
PythonKernel::~PythonKernel() { kernel_.release(); }

std::optional<std::string> PythonKernel::unsupported_reason(const AttentionCall&) const {
  // The kernel's own checks run in prepare(): they may raise, which is a failure, not a no.
  if (description_.device == "cuda" && !have_cuda()) return "no CUDA device";
  return std::nullopt;
}

std::unique_ptr<PreparedKernel> PythonKernel::prepare(const AttentionCall& call, const KernelOptions& options) const {
  return std::make_unique<PythonPrepared>(*this, call, options);
}

// One task for the whole list: the kernel's precompile() decides, per header, whether its kind is
// compiled already. Ragged headers are left to their calls (their sequences are data).
void PythonKernel::expect_calls(const std::vector<AttentionCall>& headers, const KernelOptions& options) const {
  if (headers.empty() || !compiles_ahead_ || (description_.device == "cuda" && !have_cuda())) return;
  BackgroundPython::instance().post([this, headers, quant = options.quant] {
    ensure_torch();
    const py::object& plugin = interpreter().plugin;
    for (const AttentionCall& header : headers) {
      if (header.is_ragged()) continue;
      try {
        const py::object done = plugin.attr("_precompile")(kernel_, spec_fields(header, quant));
        if (done.is_none()) continue;
        const auto [kind, seconds] = done.cast<std::pair<std::string, double>>();
        const std::lock_guard lock(compilations_mutex_);
        compilations_.push_back({description_.name, kind, seconds});
      } catch (py::error_already_set& error) {
        // The call itself compiles, and fails, where it is replayed; here it only did not go ahead.
        std::cerr << fmt::format("attnreplay: warning: {}: compiling ahead for {}: {}\n", description_.name,
                                 header.where(), error.what());
        return;
      }
    }
  });
}

std::vector<AheadCompilation> PythonKernel::ahead_compilations() const {
  const std::lock_guard lock(compilations_mutex_);
  return compilations_;
}

at::Tensor PythonKernel::run_resident(const AttentionCall& call, const ModelInputs& inputs,
                                      const KernelOptions& options) const {
  c10::AutoGradMode no_grad(false);
  py::gil_scoped_acquire gil;
  ensure_torch();
  const py::object spec = accepted_spec(kernel_, call, options.quant);
  py::dict extension_tensors;
  add_extension_tensors(extension_tensors, call, inputs.q.device());
  try {
    return interpreter().plugin.attr("_run_resident")(kernel_, spec, inputs.q, inputs.k, inputs.v,
                                         inputs.mask ? py::cast(*inputs.mask) : py::none(), extension_tensors)
        .cast<at::Tensor>();
  } catch (py::error_already_set& error) {
    throw_failure(error, "run()");
  }
}

}  // namespace python_host

using namespace python_host;

PythonKernelsLoaded load_python_kernels(const std::vector<std::string>& modules, bool with_adapters) {
  PythonKernelsLoaded loaded;
  Interpreter& it = interpreter();
  if (!it.error.empty()) {
    for (const std::string& module : modules) loaded.errors.push_back(fmt::format("{}: not loaded: {}", module, it.error));
    if (with_adapters) it.broken_adapters = {{"(library adapters)", it.error}};
    return loaded;
  }
  py::gil_scoped_acquire gil;
  if (with_adapters && !it.adapters_loaded) {
    it.adapters_loaded = true;
    if (it.ours) {
      // attnreplay's own process: read, not imported; each imports when a run needs it.
      register_adapter_kernels(it, loaded.errors);
    } else {
      // A Python job substituting a kernel: its one kernel is wanted now, on the job's thread. An
      // adapter whose package is absent says so itself; one that breaks otherwise is listed too.
      try {
        ensure_torch();
        for (const auto& failure : it.plugin.attr("_load_adapters")(it.dirs.adapters)) {
          const auto pair = failure.cast<std::pair<std::string, std::string>>();
          it.broken_adapters.emplace_back(fs::path(pair.first).stem().string(), pair.first + ": " + pair.second);
        }
      } catch (py::error_already_set& error) {
        it.broken_adapters.emplace_back("(library adapters)", error.what());
      }
    }
  }
  if (!modules.empty()) {
    try {
      ensure_torch();
    } catch (py::error_already_set& error) {
      for (const std::string& module : modules) {
        loaded.errors.push_back(fmt::format("{}: not loaded: torch does not import: {}", module, error.what()));
      }
      return loaded;
    }
  }
  for (const std::string& module : modules) {
    try {
      const auto names = it.plugin.attr("_load")(module).cast<std::vector<std::string>>();
      if (names.empty()) loaded.errors.push_back(fmt::format("{}: registered no kernel", module));
    } catch (py::error_already_set& error) {
      std::string line = error.what();
      try {
        line = it.plugin.attr("_describe")(error.value(), error.trace()).cast<py::tuple>()[0].cast<std::string>();
      } catch (py::error_already_set&) {
      }
      loaded.errors.push_back(fmt::format("{}: does not load: {}", module, line));
    }
  }
  for (const auto& entry : it.plugin.attr("_entries")()) {
    const auto pair = entry.cast<py::tuple>();
    const py::object kernel = pair[0];
    const std::string source = pair[1].cast<std::string>();
    const std::string name = kernel.attr("name").cast<std::string>();
    // An adapter's kernels are in the registry already, as AdapterKernels.
    if (it.adapter_files.count(source) || !it.registered.insert(name).second) continue;
    try {
      KernelRegistry::SourceScope scope(source);
      KernelRegistry::instance().add(std::make_unique<PythonKernel>(kernel, source));
    } catch (const InputError& error) {
      loaded.errors.push_back(error.what());
    }
  }
  for (std::string& error : KernelRegistry::instance().take_rejected()) loaded.errors.push_back(std::move(error));
  return loaded;
}

void run_python_exit_handlers() {
  const Interpreter* it = started_interpreter;
  if (!it || !it->ours || !it->error.empty()) return;
  // Nothing of Python runs beside the process's end: an import or a compilation ahead that no call
  // waited for is waited for here.
  BackgroundPython::instance().wait_idle();
  py::gil_scoped_acquire gil;
  try {
    py::module_::import("atexit").attr("_run_exitfuncs")();
    const py::module_ sys = py::module_::import("sys");
    for (const char* stream : {"stdout", "stderr"}) {
      if (!sys.attr(stream).is_none()) sys.attr(stream).attr("flush")();
    }
  } catch (py::error_already_set& error) {
    std::cerr << "warning: Python's exit handlers: " << error.what() << '\n';
  }
}

std::vector<std::pair<std::string, std::string>> unavailable_python_kernels() {
  Interpreter& it = interpreter();
  std::vector<std::pair<std::string, std::string>> unavailable = it.broken_adapters;
  if (!it.error.empty()) return unavailable;
  unavailable.insert(unavailable.end(), it.not_installed.begin(), it.not_installed.end());
  // The plug-in API's own list (libraries installed that did not import): a kernel registered after
  // all is no longer on it.
  py::gil_scoped_acquire gil;
  for (const auto& item : it.plugin.attr("_unavailable_kernels")()) {
    unavailable.push_back(item.cast<std::pair<std::string, std::string>>());
  }
  return unavailable;
}

}  // namespace attnreplay
