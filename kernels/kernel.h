#pragma once
// One interface for every attention kernel: the exact reference, torch's SDPA backends, our own
// CUDA kernels, and whatever the user's environment provides. A kernel says whether it can run a
// call (and why not), prepares its inputs once, then runs as often as the timer asks.
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "formats/attention_call.h"
#include "kernels/quant_options.h"

namespace attnreplay {

// What a kernel computes beyond plain masked, causal attention (AttentionCall::extensions): the
// runner refuses a call that needs more for the kernel, naming what is missing, so that no kernel
// is judged having silently computed something else.
struct Extensions {
  bool window = false, softcap = false, alibi = false, sinks = false;
  static Extensions all() { return {true, true, true, true}; }
};

struct KernelDescription {
  std::string name;     // what --kernels takes, e.g. "torch-flash-cpu"
  std::string summary;  // one line for `attnreplay kernels`
  std::string device;   // "cpu" or "cuda"
  // Set for the exact reference: it is what error statistics are measured against.
  bool is_reference = false;
  // The lowest precision a quantized kernel computes in (int8, float8_e4m3fn): --refcheck's default
  // thresholds are then that dtype's rather than the inputs' (docs/metrics.md).
  std::optional<DType> reduced_precision;
  Extensions extensions;
  // Takes a ragged (thd) call as one, packed (`ragged`) and with a paged KV cache too (`paged`,
  // reading the pages or gathering them itself).
  // The runner hands a kernel that does not a ragged call one sequence at a time
  // (kernels/per_sequence.h), as a dense call each, timed together.
  bool ragged = false, paged = false;
  // How it takes a mask: as the tensor the model gave (torch's backends, the libraries' kernels); or
  // by its diagonals alone (attnreplay's own kernels: causality at any offset, for the emulations a
  // sliding window too, formats/mask_structure.h), so that the runner hands it a call whose mask is
  // key ranges per sequence (padding) one batch entry at a time, cut to its ranges
  // (kernels/per_sequence.h); a mask of any other form it takes or declines itself.
  enum class Masks { tensor, diagonals };
  Masks masks = Masks::tensor;
  // A CPU emulation of a GPU kernel (kernels/emulated_kernel.h): its outputs are the GPU kernel's,
  // its time is not representative of anything.
  bool emulation = false;
  // What the headline time is where the kernel has an input preparation (docs/metrics.md).
  enum class Headline {
    kernel,      // run() alone, the kernel (attnreplay's own, timed as peers quote theirs); the whole call beside it
    whole_call,  // preparation then run(): a library's function that does that work inside; run() alone beside it
    run_is_call, // run() is a library's function as users call it; the preparation is set-up they do once
  };
  Headline headline = Headline::kernel;
};

// What `call` needs that `kernel` does not compute, in words ("a softcap of 30"); empty when none.
std::vector<std::string> missing_extensions(const KernelDescription& kernel, const AttentionCall& call);

class Kernel;
// Why `kernel` does not take `call`, before any input is touched: an extension it does not compute,
// or its own unsupported_reason. Nullopt when it takes it. What the replay and kernel substitution
// both ask.
std::optional<std::string> kernel_declines(const Kernel& kernel, const AttentionCall& call);

// What a run's flags set for the kernels; each kernel's prepare() reads the part that concerns it.
struct KernelOptions {
  QuantOptions quant;  // the quantized kinds' (docs/quantized.md): --quant_gran, --pv_accum_dtype, ...
  // Whether our kernels may split the call's keys (docs/quantized.md, "Key splits"): not for the
  // sequences of a batch, which one launch attends to together (kernels/per_sequence.h).
  bool split_keys = true;
};

// A kernel bound to one call with its inputs in place (layout changed, uploaded). run() does
// only the attention work so that it can be timed; output() is read once afterwards.
class PreparedKernel {
 public:
  virtual ~PreparedKernel() = default;
  virtual void run() = 0;
  // The last run's output as (batch, heads_q, seq_q, head_dim_vo), contiguous, on the host.
  virtual HostTensor output() = 0;
  // Waits until work queued by run() has finished (GPU kernels); CPU kernels finish in run().
  virtual void synchronize() {}
  // Kernels whose inputs need work before the attention itself (GQA expansion, a mask conversion,
  // quantization, a layout change) say so, and redo that work from the inputs as the model had
  // them in prepare_inputs(): the runner times it with run() as a second figure, since peers quote
  // the kernel alone and users pay both.
  virtual bool has_preparation() const { return false; }
  virtual void prepare_inputs() {}
  // The least bytes that preparation must move (read and written), where the kernel can say: the
  // runner sets its time beside moving them at the GPU's measured copy rate. 0: not said.
  virtual double preparation_bytes() const { return 0; }
  // Seconds spent compiling for this call before any run (a torch.compile'd or autotuned kernel's
  // first use): reported apart from every figure. 0: none.
  virtual double compile_seconds() const { return 0; }
  // GPU kernels whose run() (and prepare_inputs()) queue all their work on the current CUDA stream
  // (c10::cuda::getCurrentCUDAStream(), as torch's ops do), not on the legacy default stream, say
  // so: only they can be captured into a CUDA graph (--timing graph sets a side stream current while
  // it captures). The current stream is the default stream at all other times.
  virtual bool runs_on_current_stream() const { return false; }
};

// Thrown by prepare() when a check that needs the real inputs (torch's own backend checks, say)
// declines the call: the runner reports it as not_supported with this message, not as a failure.
class KernelNotSupported : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thrown by a kernel whose failure has more to say than one line (a plug-in's Python traceback):
// the row's reason is what(), and `detail` goes to the JSON only, where it cannot flood the table.
class KernelFailure : public std::runtime_error {
 public:
  KernelFailure(const std::string& message, std::string detail)
      : std::runtime_error(message), detail_(std::move(detail)) {}
  const std::string& detail() const { return detail_; }

 private:
  std::string detail_;
};

// A compilation a kernel did ahead of the calls that need it, beside the replay of other kernels:
// reported apart, in no figure.
struct AheadCompilation {
  std::string kernel;
  std::string kind;  // the kind of call it serves, in the kernel's words
  double seconds = 0;
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual const KernelDescription& description() const = 0;
  // nullopt when the call is supported; otherwise the reason, shown to the user as is.
  virtual std::optional<std::string> unsupported_reason(const AttentionCall& call) const = 0;
  virtual std::unique_ptr<PreparedKernel> prepare(const AttentionCall& call, const KernelOptions& options) const = 0;
  const std::string& name() const { return description().name; }

  // Work a kernel does beside the replay, on a thread of its own (a library's import, compiling
  // ahead): ready() says whether it is done, so that a replay neither waits for it while other
  // kernels have work, nor times the kernel while that work runs (replay/run/replay_capture.cpp);
  // wait_until_ready() waits. prepare() itself waits where it must. ready() starts that work where
  // it has not started: a run asks it of each kernel it selected as soon as it knows them.
  virtual bool ready() const { return true; }
  virtual void wait_until_ready() const {}
  // The calls a replay will bring (headers: shapes and arguments, no tensors), before the first,
  // for a kernel that compiles per kind of call and wants them: it starts those compilations
  // beside the replay.
  virtual bool compiles_ahead() const { return false; }
  virtual void expect_calls(const std::vector<AttentionCall>& /*headers*/, const KernelOptions& /*options*/) const {}
  // What it compiled ahead so far.
  virtual std::vector<AheadCompilation> ahead_compilations() const { return {}; }
};

// Kernels register themselves from their own file: adding one touches no central list. Plug-ins
// (a shared library, a Python file) register the same way while the registry knows their source.
class KernelRegistry {
 public:
  static KernelRegistry& instance();
  bool add(std::unique_ptr<Kernel> kernel);
  const std::vector<std::unique_ptr<Kernel>>& kernels() const { return kernels_; }
  const Kernel* find(std::string_view name) const;
  // Where a kernel came from: "built-in", or the plug-in file that registered it.
  std::string source_of(std::string_view name) const;
  // Plug-in registrations refused since the last call (a name already taken), each naming its file.
  std::vector<std::string> take_rejected();

  // Kernels added while one lives are recorded as coming from `source`.
  class SourceScope {
   public:
    explicit SourceScope(std::string source);
    ~SourceScope();
    SourceScope(const SourceScope&) = delete;
    SourceScope& operator=(const SourceScope&) = delete;

   private:
    std::string previous_;
  };

 private:
  std::vector<std::unique_ptr<Kernel>> kernels_;
  std::map<std::string, std::string, std::less<>> sources_;
  std::string loading_source_;
  std::vector<std::string> rejected_;
};

// Use at namespace scope in a kernel's file: ATTNREPLAY_REGISTER_KERNEL(MyKernel);
#define ATTNREPLAY_REGISTER_KERNEL_IMPL(Type, line) \
  static const bool attnreplay_registered_##line =  \
      ::attnreplay::KernelRegistry::instance().add(std::make_unique<Type>())
#define ATTNREPLAY_REGISTER_KERNEL_AT(Type, line) ATTNREPLAY_REGISTER_KERNEL_IMPL(Type, line)
#define ATTNREPLAY_REGISTER_KERNEL(Type) ATTNREPLAY_REGISTER_KERNEL_AT(Type, __LINE__)

}  // namespace attnreplay
