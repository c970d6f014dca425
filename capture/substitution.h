#pragma once
// Kernel substitution (ATTNCAP_SUBSTITUTE, docs/capture.md): the capture part hands a call it
// recognised to an attnreplay kernel and gives the job that kernel's output in place of the op's.
//
// The kernels are built once, against the torch attnreplay was built with, into
// libattncap_kernels.so beside that torch's capture part; a part built for another torch
// (attnreplay-capture-build) has none beside it, and substitution is then off, said at start. Both
// parts come from one build, so C++ types cross between them.
#include <string>
#include <variant>

#include "formats/attention_call.h"

namespace attnreplay::capture {

class Substitution {
 public:
  virtual ~Substitution() = default;
  virtual const std::string& kernel_name() const = 0;
  // The kernel's output for `call` (its tensors on the host) as (batch, heads_q, seq_q,
  // head_dim_v), contiguous; or, in words, why the kernel does not take the call.
  virtual std::variant<HostTensor, std::string> compute(const AttentionCall& call) = 0;
};

// libattncap_kernels.so's entry point: the substitution by `kernel`, or null with `error` set.
inline constexpr const char* kOpenSubstitutionSymbol = "attncap_open_substitution";
using OpenSubstitutionFn = Substitution* (*)(const char* kernel, std::string* error);
inline constexpr const char* kKernelsPartFile = "libattncap_kernels.so";

}  // namespace attnreplay::capture
