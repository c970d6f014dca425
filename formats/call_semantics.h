#pragma once
// Every argument of a captured call honoured or loudly refused. The record holds Q, K, V, the
// mask, the scale, causality and its alignment, dropout and GQA; capture keeps every other
// argument the model passed in the call's metadata ("arg.<name>", tensors as "tensor <dtype>
// [shape]"). Each is judged here: neutral (it changes only what is returned beside the output, or
// how fast: return_softmax, deterministic, num_splits), neutral at its default (window_size_left
// -1, softcap 0, alibi_slopes None), or changing the output in a way the record cannot represent.
// A call with one of the last, or with an argument not known at all, is not replayed: every
// kernel would be judged against the wrong answer.
#include <string>
#include <vector>

#include "formats/attention_call.h"

namespace attnreplay {

// "window_size_left=64 (a sliding window)", one per argument the replay cannot honour; empty when
// every argument is honoured.
std::vector<std::string> unreplayable_arguments(const AttentionCall& call);

}  // namespace attnreplay
