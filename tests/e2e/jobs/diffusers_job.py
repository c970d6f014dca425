"""Tiny diffusers transformers (Flux, CogVideoX) with seeded random weights, run once each on the CPU.

Plain torch + diffusers; no hub. The configs are those of diffusers' own model tests
(tests/models/transformers/test_models_transformer_{flux,cogvideox}.py) with two layers of each
kind instead of one, so they are valid and take well under a second. The models run in one process,
in --models order. --save-dir gets <model>.npy. --count-sdpa wraps
torch.nn.functional.scaled_dot_product_attention and writes one JSON line per call (model, shapes):
the model's attention calls, counted independently of any capture tool.
"""

import argparse
import json

import numpy as np
import torch


def flux():
    from diffusers import FluxTransformer2DModel

    model = FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=2, num_single_layers=2,
                                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                   pooled_projection_dim=32, axes_dims_rope=[4, 4, 8])
    g = torch.Generator().manual_seed(1)
    tokens, text = 16, 48
    inputs = dict(hidden_states=torch.randn(1, tokens, 4, generator=g),
                  encoder_hidden_states=torch.randn(1, text, 32, generator=g),
                  pooled_projections=torch.randn(1, 32, generator=g),
                  img_ids=torch.randn(tokens, 3, generator=g), txt_ids=torch.randn(text, 3, generator=g),
                  timestep=torch.tensor([1.0]))
    return model, inputs


def cogvideox():
    from diffusers import CogVideoXTransformer3DModel

    model = CogVideoXTransformer3DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
                                        time_embed_dim=2, text_embed_dim=8, num_layers=2, sample_width=8,
                                        sample_height=8, sample_frames=8, patch_size=2, temporal_compression_ratio=4,
                                        max_text_seq_length=8)
    g = torch.Generator().manual_seed(1)
    inputs = dict(hidden_states=torch.randn(2, 1, 4, 8, 8, generator=g),
                  encoder_hidden_states=torch.randn(2, 8, 8, generator=g),
                  timestep=torch.tensor([10, 500]))
    return model, inputs


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="flux,cogvideox", help="comma-separated: flux, cogvideox (run in order)")
    parser.add_argument("--save-dir", required=True, help="writes <model>.npy here")
    parser.add_argument("--count-sdpa", help="write one JSON line per F.scaled_dot_product_attention call here")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="the models' weights and inputs (outputs are saved as float32)")
    args = parser.parse_args()
    calls = []
    current = None
    if args.count_sdpa:
        real = torch.nn.functional.scaled_dot_product_attention

        def counting(query, key, value, *rest, **kwargs):
            calls.append({"model": current, "q": list(query.shape), "k": list(key.shape), "v": list(value.shape)})
            return real(query, key, value, *rest, **kwargs)

        torch.nn.functional.scaled_dot_product_attention = counting
    builders = {"flux": flux, "cogvideox": cogvideox}
    for current in args.models.split(","):
        torch.manual_seed(0)
        model, inputs = builders[current]()
        dtype = getattr(torch, args.dtype)
        model.eval().to(dtype)
        inputs = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}
        with torch.no_grad():
            out = model(**inputs, return_dict=False)[0]
        np.save(f"{args.save_dir}/{current}.npy", out.float().numpy())
        print(f"{current}: output {tuple(out.shape)}")
    if args.count_sdpa:
        with open(args.count_sdpa, "w") as f:
            f.writelines(json.dumps(c) + "\n" for c in calls)


if __name__ == "__main__":
    main()
