#pragma once
// The tensors a job saved (`attnreplay e2e` compares two runs' files): NumPy's .npy, safetensors,
// torch.save's .pt (a tensor, or dicts, lists and tuples of them), and PNG and JPEG images
// (formats/image_file.h), told apart by content.
#include <string>
#include <utility>
#include <vector>

#include "formats/host_tensor.h"

namespace attnreplay {

// Every tensor in the file, named by its place in it ("" for a file of one tensor, "logits",
// "0.hidden" in nested containers), with its data, contiguous. Throws InputError naming the file
// and what in it cannot be read.
std::vector<std::pair<std::string, HostTensor>> read_tensor_file(const std::string& path);

}  // namespace attnreplay
