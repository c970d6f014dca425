"""A Flux-sized transformer (diffusers' FluxTransformer2DModel at FLUX.1's widths: 24 heads of 128,
a 4096-token image, 512 text tokens) with one double-stream and one single-stream block, random
seeded weights: a plain job that `attnreplay e2e` runs as is and with a kernel substituted. It
prints its step time (median of --steps forward passes after one warm-up) and saves the output.

    python bench/flux_block_job.py --device cuda --save out.pt
"""
import argparse
import statistics
import time

import torch
from diffusers import FluxTransformer2DModel


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--tokens", type=int, default=4096, help="image tokens (1024x1024 at FLUX.1's patching)")
    parser.add_argument("--text", type=int, default=512, help="text tokens")
    parser.add_argument("--steps", type=int, default=3, help="forward passes timed")
    parser.add_argument("--save", required=True, help="the output (.pt)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
                                   attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
                                   pooled_projection_dim=768, axes_dims_rope=[16, 56, 56])
    model = model.eval().to(device=args.device, dtype=dtype)
    g = torch.Generator().manual_seed(1)
    inputs = dict(hidden_states=torch.randn(1, args.tokens, 64, generator=g),
                  encoder_hidden_states=torch.randn(1, args.text, 4096, generator=g),
                  pooled_projections=torch.randn(1, 768, generator=g),
                  img_ids=torch.randn(args.tokens, 3, generator=g), txt_ids=torch.randn(args.text, 3, generator=g),
                  timestep=torch.tensor([1.0]))
    inputs = {k: v.to(args.device, dtype if k not in ("img_ids", "txt_ids") else torch.float32)
              for k, v in inputs.items()}
    times = []
    with torch.no_grad():
        for step in range(args.steps + 1):
            if args.device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = model(**inputs, return_dict=False)[0]
            if args.device == "cuda":
                torch.cuda.synchronize()
            if step > 0:
                times.append(time.perf_counter() - start)
    torch.save({"latents": out.float().cpu()}, args.save)
    print(f"flux block: output {tuple(out.shape)}, step {statistics.median(times) * 1e3:.2f} ms "
          f"(median of {len(times)})")


if __name__ == "__main__":
    main()
