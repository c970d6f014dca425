#pragma once
// The device side of the example, in plain C++ so that plugin.cpp needs no CUDA headers.
#include <cstdint>
#include <string>

struct TiledAttentionProblem {
  const float *q, *k, *v;  // (batch, heads, seq, dim), contiguous, on the GPU
  float* out;              // (batch, heads_q, seq_q, dim_vo)
  std::int64_t batch, heads_q, heads_kv, seq_q, seq_kv, dim_qk, dim_vo;
  float scale;
  bool causal;
  std::int64_t causal_shift;  // seq_kv - seq_q for bottom-right alignment, else 0
};

// Empty when launched; else the CUDA error.
std::string launch_tiled_attention(const TiledAttentionProblem& problem);
// Empty when a device is usable; else why not.
std::string cuda_device_problem();
