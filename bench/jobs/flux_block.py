"""Times steps of one Flux-sized transformer block on the GPU (1 x 4608 tokens, 24 heads x 128,
bf16): diffusers' FluxTransformerBlock with random weights when diffusers is importable, else the
same shapes in plain torch. Prints the per-step times as JSON. A job for capture's overhead."""
import argparse
import json
import os
import time

import torch
import torch.nn.functional as F


def plain_block(dim, heads):
    # attention + MLP at Flux's sizes; SDPA is the only attention call, as in Flux.
    qkv = torch.nn.Linear(dim, 3 * dim).cuda().to(torch.bfloat16)
    proj = torch.nn.Linear(dim, dim).cuda().to(torch.bfloat16)
    up = torch.nn.Linear(dim, 4 * dim).cuda().to(torch.bfloat16)
    down = torch.nn.Linear(4 * dim, dim).cuda().to(torch.bfloat16)

    def run(x):
        b, s, _ = x.shape
        q, k, v = qkv(x).view(b, s, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, dim)
        x = x + proj(a)
        return x + down(F.gelu(up(x)))
    return run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--torch-save", help="folder: x.cpu() + torch.save of each attention call")
    args = parser.parse_args()
    torch.manual_seed(0)
    dim, heads, image, text = 3072, 24, 4096, 512
    kind = "plain torch"
    try:
        from diffusers.models.transformers.transformer_flux import FluxTransformerBlock
        block = FluxTransformerBlock(dim=dim, num_attention_heads=heads, attention_head_dim=dim // heads)
        block = block.cuda().to(torch.bfloat16).eval()
        hidden = torch.randn(1, image, dim, device="cuda", dtype=torch.bfloat16)
        context = torch.randn(1, text, dim, device="cuda", dtype=torch.bfloat16)
        temb = torch.randn(1, dim, device="cuda", dtype=torch.bfloat16)
        def step():
            return block(hidden_states=hidden, encoder_hidden_states=context, temb=temb)
        kind = "diffusers FluxTransformerBlock"
    except Exception as error:  # diffusers missing or its API moved: same sizes in plain torch
        run = plain_block(dim, heads)
        x = torch.randn(1, image + text, dim, device="cuda", dtype=torch.bfloat16)
        def step():
            return run(x)
        kind = f"plain torch block ({type(error).__name__})"
    if args.torch_save:
        original = F.scaled_dot_product_attention
        counter = [0]
        def saving(q, k, v, *rest, **kwargs):
            out = original(q, k, v, *rest, **kwargs)
            torch.save({"q": q.cpu(), "k": k.cpu(), "v": v.cpu(), "out": out.cpu()},
                       os.path.join(args.torch_save, f"call_{counter[0]}.pt"))
            counter[0] += 1
            return out
        F.scaled_dot_product_attention = saving
    times = []
    with torch.inference_mode():
        for i in range(args.warmup + args.steps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            step()
            torch.cuda.synchronize()
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
    print(json.dumps({"step_s": times, "block": kind}))


if __name__ == "__main__":
    main()
