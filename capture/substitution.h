#pragma once
// Kernel substitution (ATTNCAP_SUBSTITUTE, docs/capture.md): the capture part hands a call it
// recognised to an attnreplay kernel and gives the job that kernel's output in place of the op's.
//
// The kernels are built once, against the torch attnreplay was built with, into
// libattncap_kernels.so (and, with the Python plug-in host, libattncap_python_kernels.so) beside
// that torch's capture part; a part built for another torch
// (attnreplay-capture-build) has none beside it, and substitution is then off, said at start. Both
// parts come from one build, so C++ types cross between them.
#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "formats/attention_call.h"

namespace attnreplay::capture {

class Substitution {
 public:
  virtual ~Substitution() = default;
  virtual const std::string& kernel_name() const = 0;
  // The kernel's output for `call` (its tensors on the host) as (batch, heads_q, seq_q,
  // head_dim_v), contiguous; or, in words, why the kernel does not take the call.
  virtual std::variant<HostTensor, std::string> compute(const AttentionCall& call) = 0;

  // Whether the kernel computes on the model's own tensors where they are, on this device type
  // (kernels/resident_kernel.h): a dense call is then given to compute_resident and none of its
  // tensors goes to the host.
  virtual bool takes_resident(c10::DeviceType device) = 0;
  // The same on the model's tensors: `call` holds the arguments and its tensors' shapes (their bytes
  // need not be there); q, k, v and the mask are the op's, in the call's layout. The output, as
  // compute's, on their device, queued on torch's current stream and not waited for.
  virtual std::variant<at::Tensor, std::string> compute_resident(const AttentionCall& call, const at::Tensor& q,
                                                                 const at::Tensor& k, const at::Tensor& v,
                                                                 const std::optional<at::Tensor>& mask) = 0;
};

// The kernels part's entry point: the substitution by `kernel`, or null with `error` set. A part
// with Python kernels also takes kernels that `python_modules` (files or module names) or the
// library adapters define; those load at the first call, in the job's interpreter.
inline constexpr const char* kOpenSubstitutionSymbol = "attncap_open_substitution";
using OpenSubstitutionFn = Substitution* (*)(const char* kernel, const std::vector<std::string>& python_modules,
                                             std::string* error);
// Built-in kernels only: what any job can load.
inline constexpr const char* kKernelsPartFile = "libattncap_kernels.so";
// Built-in and Python kernels: for Python jobs (it needs the job's Python symbols).
inline constexpr const char* kPythonKernelsPartFile = "libattncap_python_kernels.so";

}  // namespace attnreplay::capture
