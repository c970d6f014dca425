#include "kernels/torch_inputs.h"

#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include "formats/torch_tensor.h"

namespace attnreplay {

ModelInputs model_inputs(const AttentionCall& call, at::Device device) {
  auto bhsd = [&](const HostTensor& tensor) {
    at::Tensor t = torch_from_host_tensor(tensor).to(device);  // .to keeps dense strides
    if (t.dim() == 3) t = t.unsqueeze(1);
    return call.layout == Layout::bshd ? t.transpose(1, 2) : t;
  };
  ModelInputs in{bhsd(call.q), bhsd(call.k), bhsd(call.v), std::nullopt};
  if (call.mask) in.mask = torch_from_host_tensor(*call.mask).to(device);
  return in;
}

at::Device current_gpu() { return at::Device(at::kCUDA, at::detail::getCUDAHooks().current_device()); }

}  // namespace attnreplay
