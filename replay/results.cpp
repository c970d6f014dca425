#include "replay/results.h"

namespace attnreplay {

std::string_view disposition_name(Disposition disposition) {
  switch (disposition) {
    case Disposition::passed: return "passed";
    case Disposition::incorrect: return "incorrect";
    case Disposition::not_verified: return "not_verified";
    case Disposition::not_supported: return "not_supported";
    case Disposition::failed: return "failed";
  }
  return "?";
}

double Ceilings::matrix_tflops_for(DType dtype) const {
  switch (dtype) {
    case DType::bfloat16:
    case DType::float16: return bf16_tflops;  // fp16 and bf16 share the tensor cores' rate
    case DType::float8_e4m3fn:
    case DType::float8_e5m2: return fp8_tflops;
    case DType::int8: return int8_tops;
    default: return 0;
  }
}

std::optional<double> KernelResult::preparation_s() const {
  if (!timing_of_preparation || timing_of_preparation->untimed()) return std::nullopt;
  return timing_of_preparation->median_s;
}

std::optional<double> KernelResult::preparation_ratio() const {
  const auto seconds = preparation_s();
  if (!seconds || !preparation || preparation->bound_s <= 0) return std::nullopt;
  return *seconds / preparation->bound_s;
}

bool Report::any_failed() const {
  if (!input_errors.empty()) return true;
  for (const auto& call : calls)
    for (const auto& kernel : call.kernels)
      if (kernel.disposition == Disposition::failed) return true;
  return false;
}

}  // namespace attnreplay
