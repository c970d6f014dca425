// A C++ inference job linked to libtorch, for capture's end-to-end tests: it calls SDPA with a
// bool mask, causal, GQA and in inference mode, and writes every output's bytes to a file so that
// a test can check that capture changed nothing.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <cstdio>
#include <fstream>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUTS_FILE\n", argv[0]);
    return 2;
  }
  at::manual_seed(0);
  std::ofstream outputs(argv[1], std::ios::binary);
  auto keep = [&outputs](const at::Tensor& t) {
    const at::Tensor c = t.contiguous();
    outputs.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  };
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  // 1: plain, with a key-padding bool mask broadcast over heads and queries.
  at::Tensor q = at::randn({2, 4, 24, 16}, f32), k = at::randn({2, 4, 24, 16}, f32), v = at::randn({2, 4, 24, 16}, f32);
  at::Tensor mask = at::ones({2, 1, 1, 24}, at::TensorOptions().dtype(at::kBool));
  mask.index_put_({1, 0, 0, at::indexing::Slice(20, 24)}, false);
  keep(at::scaled_dot_product_attention(q, k, v, mask));
  // 2: causal, bf16, in inference mode.
  {
    c10::InferenceMode inference;
    keep(at::scaled_dot_product_attention(q.to(at::kBFloat16), k.to(at::kBFloat16), v.to(at::kBFloat16),
                                          std::nullopt, 0.0, /*is_causal=*/true));
  }
  // 3: GQA, 8 query heads over 2 kv heads, explicit scale.
  at::Tensor gq = at::randn({1, 8, 10, 32}, f32), gk = at::randn({1, 2, 10, 32}, f32), gv = at::randn({1, 2, 10, 32}, f32);
  keep(at::scaled_dot_product_attention(gq, gk, gv, std::nullopt, 0.0, false, 0.25, /*enable_gqa=*/true));
  std::printf("3 attention calls done\n");
  return 0;
}
