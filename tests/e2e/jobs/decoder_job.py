"""A decoder-only LLM as transformers serves it: a Llama built from a config with random weights
(seeded; nothing is downloaded), grouped-query attention (4 query heads, 2 key/value heads), a
left-padded batch and greedy `generate()`, on the CPU through torch's SDPA. It knows nothing of
attnreplay; `--device cuda --dtype bfloat16` runs it as a GPU server would, and the size flags make
it a model of a real size (bench/replay_efficiency.py: 8 layers, 32/8 heads of 128, 4 prompts of
1024 tokens and less); `--save` writes the generated tokens and the logits so that a test can check
that capture changed nothing."""
import argparse
import statistics
import time

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", help="write the tokens and logits here (.npz, or .pt: a dict torch.save writes)")
    parser.add_argument("--new-tokens", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--no-padding", action="store_true",
                        help="prompts of one length: no padding mask, so causal-only kernels take every call")
    parser.add_argument("--head-dim", type=int, default=16, help="each head's size")
    parser.add_argument("--heads", type=int, default=4, help="query heads")
    parser.add_argument("--kv-heads", type=int, default=2, help="key/value heads")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2, help="prompts")
    parser.add_argument("--prompt", type=int, default=12, help="the longest prompt's tokens")
    parser.add_argument("--pad-step", type=int, default=4,
                        help="prompt i is i x this many tokens shorter, padded on the left as generate() wants")
    parser.add_argument("--timed-generates", type=int, default=0,
                        help="after the saved run, generate this many times more and print the median decode step")
    args = parser.parse_args()
    torch.manual_seed(0)
    hidden = args.heads * args.head_dim
    config = LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, max_position_embeddings=max(128, 2 * args.prompt + 64),
                         pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).eval().to(device=args.device, dtype=getattr(torch, args.dtype))
    ids = torch.randint(3, 256, (args.batch, args.prompt))
    mask = torch.ones_like(ids)
    if not args.no_padding:
        for i in range(1, args.batch):
            pads = min(i * args.pad_step, args.prompt - 1)
            ids[i, :pads] = 0
            mask[i, :pads] = 0
    ids, mask = ids.to(args.device), mask.to(args.device)
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask).logits
        tokens = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.new_tokens, do_sample=False,
                                pad_token_id=0)
    if args.save and args.save.endswith(".pt"):
        torch.save({"tokens": tokens.cpu(), "logits": logits.float().cpu()}, args.save)
    elif args.save:
        np.savez(args.save, tokens=tokens.cpu().numpy(), logits=logits.float().cpu().numpy())
    print(f"generated {tokens.shape[1] - ids.shape[1]} tokens for {ids.shape[0]} prompts")
    if args.timed_generates > 0:
        seconds = []
        with torch.inference_mode():
            for _ in range(args.timed_generates):
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
                start = time.perf_counter()
                model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.new_tokens, do_sample=False,
                               pad_token_id=0)
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
                seconds.append(time.perf_counter() - start)
        print(f"decode step {statistics.median(seconds) / args.new_tokens * 1e3:.3f} ms (generate() of "
              f"{args.new_tokens} tokens, median of {len(seconds)})")


if __name__ == "__main__":
    main()
