#pragma once
// The dims of an attention call, as host and device code both see them: C++17, so that nvcc
// compiles it with the CUDA kernels (kernels/cuda/).
#include <cstdint>
#include <string>

namespace attnreplay {

struct AttentionShape {
  std::int64_t batch = 0;
  std::int64_t heads_q = 0;
  std::int64_t heads_kv = 0;
  std::int64_t seq_q = 0;
  std::int64_t seq_kv = 0;
  std::int64_t head_dim_qk = 0;
  std::int64_t head_dim_vo = 0;

  bool is_gqa() const { return heads_q != heads_kv; }
  std::string to_string() const;  // "b2 hq24 hkv24 sq4250 skv4250 dqk64 dvo64"
  bool operator==(const AttentionShape& o) const {
    return batch == o.batch && heads_q == o.heads_q && heads_kv == o.heads_kv && seq_q == o.seq_q &&
           seq_kv == o.seq_kv && head_dim_qk == o.head_dim_qk && head_dim_vo == o.head_dim_vo;
  }
};

}  // namespace attnreplay
