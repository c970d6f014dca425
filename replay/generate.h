#pragma once
// Generated inputs for any shape: standard normal Q, K, V from a fixed seed, rounded to the dtype.
#include <cstdint>
#include <string>

#include "formats/attention_call.h"

namespace attnreplay {

struct GeneratedCallSpec {
  AttentionShape shape;
  DType dtype = DType::bfloat16;
  Layout layout = Layout::bhsd;
  bool is_causal = false;
  CausalAlignment causal_alignment = CausalAlignment::top_left;
  std::optional<double> scale;
  std::uint64_t seed = 0;
};

AttentionCall generate_call(const GeneratedCallSpec& spec);

// The `attnreplay run` flags that generate the same call ("--shape 1,2,64,32 --num_kv_heads 2 ...").
std::string generated_call_flags(const GeneratedCallSpec& spec);

}  // namespace attnreplay
