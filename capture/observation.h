#pragma once
// What the files of capture's observer share: the process's capture state, a call under way, and
// the steps each file gives the others. observer.cpp owns the process's capture and the ops'
// observation (hooks, RecordFunction), which calls are calls and which are recorded;
// call_builder.cpp makes a call's record from its op's arguments; substitution_flow.cpp computes an
// op's output with an attnreplay kernel (ATTNCAP_SUBSTITUTE); python_calls.cpp takes the calls of
// Python entry points. Internal to capture/: nothing here is exported from the part.
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <ATen/core/stack.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <string>

#include "capture/attention_clock.h"
#include "capture/call_arguments.h"
#include "capture/call_site.h"
#include "capture/config.h"
#include "capture/recorder.h"
#include "capture/substituter.h"
#include "capture/tensor_copies.h"
#include "formats/attention_call.h"

namespace attnreplay::capture {

struct State {
  CaptureConfig config;
  std::regex ops;
  std::unique_ptr<Recorder> recorder;        // null when nothing is written (substitution alone)
  std::unique_ptr<Substituter> substituter;  // null unless ATTNCAP_SUBSTITUTE
  std::unique_ptr<AttentionClock> clock;     // null unless ATTNCAP_TIME_ATTENTION
  std::atomic<std::int64_t> next_index{0};
  std::atomic<std::int64_t> selected{0};
  std::mutex position_mutex;
  std::unique_ptr<PositionTracker> positions;
  std::string rank;
  std::set<std::string> hooked;              // op names observed by hooks, never by RecordFunction
  std::atomic<bool> record_function_on{false};  // set once an op needing RecordFunction appears
};

extern State* state;  // set once by attncap_start; never freed (callbacks may run at exit)

// A call that was not captured: counted, and its reason said once on stderr.
void count_failed();
void report_failure_once(const std::exception& error);

// The op through which capture's Python side (python_entry_points.py) hands over calls of Python
// entry points; its kernel records them. Never matched by name: the call's own name is.
inline constexpr const char* kPythonCall = "attncap::python_call";

// Whether capture observes the op of this name (ATTNCAP_OPS, no backward unless asked).
bool op_wanted(const std::string& name);

// Which call this is, and whether it is recorded: every call counts, recorded or not.
struct Selection {
  std::int64_t index;
  bool wanted;
};
Selection select_call();

// Where a call came from and its place in the run (layer, step), where call sites are on.
struct CallPlace {
  CallSite site;
  PositionTracker::Position position;
};
std::optional<CallPlace> place_call();

struct PendingCall final : at::ObserverContext {
  bool record = false;
  AttentionCall call;  // everything but the tensor data
  std::shared_ptr<TensorCopies> copies = std::make_shared<TensorCopies>();
  std::chrono::steady_clock::time_point started;
  // Under ATTNCAP_SUBSTITUTE: whether the kernel is to be asked, whether it gave the output, and
  // otherwise why the call was left to the op. `after_the_op`: the op runs and its attention
  // output is then overwritten in place (an op that returns more, or one no hook stands before).
  bool substitute = false, after_the_op = false, substituted = false, on_gpu = false;
  std::string left_reason;
  // A dense call the kernel computes on the op's own tensors (Substituter::takes_resident): these,
  // as the op got them. None goes to the host unless the call is recorded.
  struct Resident {
    at::Tensor q, k, v;
    std::optional<at::Tensor> mask;
  };
  bool resident_wanted = false;  // the kernel takes the query's device; set before fill_call
  std::optional<Resident> resident;
  std::optional<at::Tensor> python_output;  // a Python entry point's output, which it has returned
  // What an op the kernel runs in place of returns (substitute_hooked): SDPA's output, the query's
  // leading dims and the value's head dim, in the query's dtype and on its device.
  std::vector<std::int64_t> output_sizes;
  at::TensorOptions output_options;
  std::shared_ptr<AttentionClock::Started> timing;  // under ATTNCAP_TIME_ATTENTION
};

// Marks an inner or ignored matched op, so the end callback keeps the depth right.
struct PassThrough final : at::ObserverContext {};

// A matched op starts: the outermost one becomes a call (recorded if selected, or as `preselected`
// says; substituted where ATTNCAP_SUBSTITUTE takes it); one inside it names the backend that ran.
std::unique_ptr<at::ObserverContext> begin_call(const std::string& op, const c10::FunctionSchema* schema,
                                                c10::ArrayRef<c10::IValue> inputs, std::int64_t sequence_nr,
                                                bool hooked, std::optional<Selection> preselected = std::nullopt);
// A matched op ends. `outputs` is null when its kernel threw: nothing is recorded then.
void end_call(at::ObserverContext* context, const c10::ArrayRef<c10::IValue>* outputs);

// Exit handlers run in reverse order of registration, and CUDA (like every lazily made static)
// registers its teardown when it starts. Preparing the copy machinery, then registering capture's
// flush again once a GPU call is seen, makes the flush run first, while pending copies can complete.
void flush_before_cuda_exits(const at::Tensor& tensor);

// call_builder.cpp: the record from the op's arguments. Tensors are copied to host memory now:
// after the start callback the inputs are no longer ours to read.
void fill_call(PendingCall& pending, const std::string& op, const c10::FunctionSchema* schema,
               const CallArguments& arguments, std::int64_t sequence_nr, std::int64_t index,
               const std::optional<CallPlace>& place);

// substitution_flow.cpp: whether the kernel is to be asked for this call, or why not.
void judge_substitution(PendingCall& pending, const std::string& op, const c10::FunctionSchema* schema, bool hooked,
                        const CallArguments& arguments, std::int64_t index, const std::optional<CallPlace>& place);
// After the op ran: its attention output overwritten in place by the kernel's.
void substitute_after_the_op(PendingCall& pending, c10::ArrayRef<c10::IValue> outputs);
// In the hook, before the op: the kernel's output pushed in place of the op's run; false where the
// op is to run after all.
bool substitute_hooked(at::ObserverContext* context, const c10::FunctionSchema& schema, torch::jit::Stack* stack);

// python_calls.cpp: defines the ops python_entry_points.py calls.
void define_python_call_ops();

}  // namespace attnreplay::capture
