#pragma once
// A mask read as structure where it lies (formats/mask_structure.h), on the GPU for a job's mask
// there (kernel substitution): only each row's first and last visible key and a few flags come to
// the host, 20 bytes a row rather than the mask (a 4 x 1 x 4096 x 4096 bool mask is 64 MB, its rows'
// 0.3 MB). The same reading, reason for reason, as read_mask_structure on the mask's values.
#include <ATen/core/Tensor.h>

#include "formats/mask_structure.h"

namespace attnreplay {

// `mask` (bool, or additive of any real dtype) broadcastable, as torch broadcasts it, to
// (batch, heads_q, seq_q, seq_kv) of `shape`. Waits for the work queued on the mask's stream.
MaskReading read_mask_structure_of_tensor(const at::Tensor& mask, const AttentionShape& shape);

}  // namespace attnreplay
