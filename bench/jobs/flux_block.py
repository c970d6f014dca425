"""Times steps of one Flux-sized transformer block on the GPU (1 x 4608 tokens, 24 heads x 128,
bf16): diffusers' FluxTransformerBlock with random weights when diffusers is importable, else the
same shapes in plain torch. Prints the per-step times as JSON. A job for capture's overhead."""
import argparse
import json
import os
import time

import torch
import torch.nn.functional as F


def plain_block(dim, heads, save_folder=None):
    # attention + MLP at Flux's sizes; SDPA is the only attention call, as in Flux. With
    # `save_folder`, each call's tensors are copied to the host and torch.save'd inline: what users
    # do without a capture tool.
    qkv = torch.nn.Linear(dim, 3 * dim).cuda().to(torch.bfloat16)
    proj = torch.nn.Linear(dim, dim).cuda().to(torch.bfloat16)
    up = torch.nn.Linear(dim, 4 * dim).cuda().to(torch.bfloat16)
    down = torch.nn.Linear(4 * dim, dim).cuda().to(torch.bfloat16)

    def run(x):
        b, s, _ = x.shape
        q, k, v = qkv(x).view(b, s, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)
        if save_folder:
            run.calls += 1
            torch.save({"q": q.cpu(), "k": k.cpu(), "v": v.cpu(), "out": out.cpu()},
                       os.path.join(save_folder, f"call_{run.calls}.pt"))
        a = out.transpose(1, 2).reshape(b, s, dim)
        x = x + proj(a)
        return x + down(F.gelu(up(x)))
    run.calls = 0
    return run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--plain", action="store_true", help="the plain-torch block, not diffusers'")
    parser.add_argument("--torch-save", help="folder: x.cpu() + torch.save of each attention call (plain block)")
    args = parser.parse_args()
    torch.manual_seed(0)
    dim, heads, image, text = 3072, 24, 4096, 512
    kind = "plain torch"
    try:
        if args.plain or args.torch_save:
            raise ImportError("plain block asked for")
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
        run = plain_block(dim, heads, args.torch_save)
        x = torch.randn(1, image + text, dim, device="cuda", dtype=torch.bfloat16)
        def step():
            return run(x)
        kind = f"plain torch block ({type(error).__name__})"
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
