#include "formats/call_semantics.h"

#include <catch2/catch_test_macros.hpp>

namespace attnreplay {
namespace {

AttentionCall with_args(std::map<std::string, std::string> args) {
  AttentionCall call;
  for (const auto& [name, value] : args) call.metadata["arg." + name] = value;
  call.metadata["step"] = "0";  // not an argument
  return call;
}

TEST_CASE("unreplayable_arguments: neutral arguments and defaults pass, the rest are named") {
  CHECK(unreplayable_arguments(with_args({})).empty());
  CHECK(unreplayable_arguments(with_args({{"return_softmax", "True"}, {"deterministic", "True"},
                                          {"window_size_left", "-1"}, {"window_size_right", "-1"},
                                          {"softcap", "0"}, {"alibi_slopes", "None"}, {"block_table", "None"}}))
            .empty());
  CHECK(unreplayable_arguments(with_args({{"window_size_left", "64"}})) ==
        std::vector<std::string>{"window_size_left=64 (a sliding window)"});
  CHECK(unreplayable_arguments(with_args({{"custom_mask_type", "1"}})) ==
        std::vector<std::string>{"custom_mask_type=1 (a causal mask given as xformers' mask type)"});
  CHECK(unreplayable_arguments(with_args({{"block_table", "tensor Int [2,8]"}, {"softcap", "50"}})).size() == 2);
  CHECK(unreplayable_arguments(with_args({{"frobnicate", "3"}})) ==
        std::vector<std::string>{"frobnicate=3 (an argument the record does not know)"});
}

TEST_CASE("unreplayable_arguments: FlashInfer's and flash_attn_with_kvcache's names, as capture's Python side writes them") {
  CHECK(unreplayable_arguments(with_args({{"backend", "auto"}, {"pos_encoding_mode", "NONE"}, {"q_scale", "None"},
                                          {"use_fp16_qk_reduction", "False"}, {"q_len_per_req", "1"},
                                          {"float_workspace_buffer", "tensor Byte [1024]"},
                                          {"k_appended", "tensor Half [2,1,2,16]"}, {"rotary_cos", "None"}}))
            .empty());
  CHECK(unreplayable_arguments(with_args({{"pos_encoding_mode", "ROPE_LLAMA"}})) ==
        std::vector<std::string>{"pos_encoding_mode=ROPE_LLAMA (a positional encoding inside the kernel)"});
  CHECK(unreplayable_arguments(with_args({{"packed_custom_mask", "tensor Byte [12]"}})) ==
        std::vector<std::string>{"packed_custom_mask=tensor Byte [12] (a custom mask)"});
  CHECK(unreplayable_arguments(with_args({{"k_scale", "0.5"}})) == std::vector<std::string>{"k_scale=0.5 (FP8 scales)"});
  // The MLA wrapper's.
  CHECK(unreplayable_arguments(with_args({{"num_heads", "128"}, {"head_dim_ckv", "512"}, {"head_dim_kpe", "64"},
                                          {"ckv_scale", "None"}, {"kpe_scale", "None"}, {"kv_len", "None"},
                                          {"return_lse_base_on_e", "False"}, {"profiler_buffer", "None"}}))
            .empty());
  CHECK(unreplayable_arguments(with_args({{"ckv_scale", "0.02"}})) == std::vector<std::string>{"ckv_scale=0.02 (FP8 scales)"});
}

TEST_CASE("unreplayable_arguments: cu_seqlens_k_new counts only with k_new, as SGLang's FA3 prefill passes it") {
  const std::string offsets = "tensor Int [4]";
  CHECK(unreplayable_arguments(with_args({{"cu_seqlens_k_new", offsets}, {"k_new", "None"}})).empty());
  // Without k_new among the arguments nothing says the offsets go unread.
  CHECK(unreplayable_arguments(with_args({{"cu_seqlens_k_new", offsets}})) ==
        std::vector<std::string>{"cu_seqlens_k_new=tensor Int [4] (keys appended to a KV cache)"});
  CHECK(unreplayable_arguments(with_args({{"cu_seqlens_k_new", offsets}, {"k_new", "tensor Half [5,2,16]"}})) ==
        std::vector<std::string>{"cu_seqlens_k_new=tensor Int [4] (keys appended to a KV cache)",
                                 "k_new=tensor Half [5,2,16] (keys appended to a KV cache)"});
  CHECK(unreplayable_arguments(with_args({{"sparse_mask_fine", "None"}})).empty());
  CHECK(unreplayable_arguments(with_args({{"sparse_mask_fine", "tensor Int [9,4,1]"}})) ==
        std::vector<std::string>{"sparse_mask_fine=tensor Int [9,4,1] (a block-sparse mask)"});
}

TEST_CASE("unreplayable_arguments: vLLM's names, neutral as vLLM passes them and named otherwise") {
  CHECK(unreplayable_arguments(with_args({{"gen", "None"}, {"cp_world_size", "1"}, {"cp_rank", "0"},
                                          {"cp_tot_seqused_k", "None"}, {"k", "None"}, {"v", "None"}}))
            .empty());
  CHECK(unreplayable_arguments(with_args({{"cp_world_size", "2"}, {"cp_rank", "1"}})) ==
        std::vector<std::string>{"cp_rank=1 (context parallelism)", "cp_world_size=2 (context parallelism)"});
  // fwd_kvcache's k and v, kept as arguments only there: keys it appends.
  CHECK(unreplayable_arguments(with_args({{"k", "tensor Half [3,1,2,16]"}})) ==
        std::vector<std::string>{"k=tensor Half [3,1,2,16] (keys appended to a KV cache)"});
}

}  // namespace
}  // namespace attnreplay
