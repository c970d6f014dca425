"""A decoder-only LLM as transformers serves it: a Llama built from a config with random weights
(seeded; nothing is downloaded), grouped-query attention (4 query heads, 2 key/value heads), a
left-padded batch and greedy `generate()`, on the CPU through torch's SDPA. It knows nothing of
attnreplay; `--device cuda --dtype bfloat16` runs it as a GPU server would; `--save` writes the generated tokens and the logits so that a test can check that
capture changed nothing."""
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
    parser.add_argument("--head-dim", type=int, default=16, help="each head's size (4 query heads, 2 key/value heads)")
    parser.add_argument("--timed-generates", type=int, default=0,
                        help="after the saved run, generate this many times more and print the median decode step")
    args = parser.parse_args()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=4 * args.head_dim, intermediate_size=8 * args.head_dim,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).eval().to(device=args.device, dtype=getattr(torch, args.dtype))
    ids = torch.randint(3, 256, (2, 12))
    mask = torch.ones_like(ids)
    if not args.no_padding:
        ids[1, :4] = 0  # the second prompt is 4 tokens shorter, padded on the left as generate() wants
        mask[1, :4] = 0
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
