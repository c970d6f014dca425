"""A serving engine's decode loop as the dispatcher sees it: each step, every layer projects one
token per sequence and calls _vllm_fa2_C::varlen_fwd over a paged KV cache, as vLLM's
FlashAttention backend does (packed queries, cu_seqlens_q, seqused_k, block_table, `out` given).
The op is a stand-in registered under vLLM's name and schema that computes with torch ops on the
job's device, queueing work as the real kernel does and never waiting for it. The caches stay at
their length (nothing is appended), so every step does the same work.

Prints JSON: each step's time on the job's stream (an event at its end, so that capture's side
stream is not waited for), the bytes one call's arguments hold, and the device's clone bandwidth
(what copying those bytes on the job's stream costs). A job for bench/capture_overhead.py."""
import argparse
import json
import time

import torch

VLLM_FA2 = torch.library.Library("_vllm_fa2_C", "DEF")
VLLM_FA2.define(
    "varlen_fwd(Tensor! q, Tensor k, Tensor v, Tensor!? out, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
    "Tensor? seqused_k, Tensor? leftpad_k, Tensor? block_table, Tensor? alibi_slopes, int max_seqlen_q, "
    "int max_seqlen_k, float p_dropout, float softmax_scale, bool zero_tensors, bool is_causal, "
    "int window_size_left, int window_size_right, float softcap, bool return_softmax, Generator? gen) -> Tensor[]")


def varlen_fwd(q, k_cache, v_cache, out, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k, block_table,
               alibi_slopes, max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale, zero_tensors, is_causal,
               window_size_left, window_size_right, softcap, return_softmax, gen):
    # One query a sequence (a decode step), keys gathered from the pages the table lists.
    batch, width = block_table.shape
    if q.shape[0] != batch or window_size_left >= 0 or softcap != 0.0 or alibi_slopes is not None:
        raise RuntimeError("this stand-in computes decode steps without windows, softcap or ALiBi only")
    page, heads_kv, dim = k_cache.shape[1:]
    keys = k_cache[block_table].reshape(batch, width * page, heads_kv, dim).transpose(1, 2)
    values = v_cache[block_table].reshape(batch, width * page, heads_kv, dim).transpose(1, 2)
    used = torch.arange(width * page, device=q.device) < seqused_k[:, None]
    result = torch.nn.functional.scaled_dot_product_attention(
        q[:, None].transpose(1, 2), keys, values, attn_mask=used[:, None, None, :], scale=softmax_scale,
        enable_gqa=True).transpose(1, 2)[:, 0]
    out.copy_(result)
    return [out, q.new_empty(q.shape[1], q.shape[0], dtype=torch.float32)]


for _device in ("CPU", "CUDA"):
    VLLM_FA2.impl("varlen_fwd", varlen_fwd, _device)


def clone_gb_per_s(device, nbytes):
    """Device-to-device copy bandwidth, timed on the job's stream: what capture's clones cost it."""
    block = torch.ones(nbytes, dtype=torch.uint8, device=device)
    block.clone()
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(5):
            block.clone()
        return 5 * nbytes / (time.perf_counter() - start) / 1e9
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(5):
        block.clone()
    end.record()
    end.synchronize()
    return 5 * nbytes / (begin.elapsed_time(end) / 1e3) / 1e9


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--page", type=int, default=16)
    parser.add_argument("--cache", type=int, default=2048, help="keys each sequence's cache holds")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    hidden = args.heads * args.dim
    pages_per_sequence = -(-args.cache // args.page)
    pages = args.batch * pages_per_sequence
    layers = []
    for _ in range(args.layers):
        layers.append({
            "qkv": torch.randn(hidden, hidden + 2 * args.kv_heads * args.dim, device=device, dtype=dtype) / hidden ** 0.5,
            "proj": torch.randn(hidden, hidden, device=device, dtype=dtype) / hidden ** 0.5,
            "k_cache": torch.randn(pages, args.page, args.kv_heads, args.dim, device=device, dtype=dtype),
            "v_cache": torch.randn(pages, args.page, args.kv_heads, args.dim, device=device, dtype=dtype),
            # each sequence's pages scattered over the cache, as an engine's allocator leaves them
            "table": torch.randperm(pages, device=device).view(args.batch, pages_per_sequence).to(torch.int32)})
    used = torch.randint(args.cache // 2, args.cache + 1, (args.batch,), device=device, dtype=torch.int32)
    cu_seqlens_q = torch.arange(args.batch + 1, device=device, dtype=torch.int32)
    cu_seqlens_k = torch.empty_like(cu_seqlens_q)  # unused with seqused_k; the schema wants one
    out = torch.empty(args.batch, args.heads, args.dim, device=device, dtype=dtype)
    scale = args.dim ** -0.5
    x = torch.randn(args.batch, hidden, device=device, dtype=dtype)

    def step(x):
        for layer in layers:
            q = (x @ layer["qkv"])[:, :hidden].reshape(args.batch, args.heads, args.dim)
            torch.ops._vllm_fa2_C.varlen_fwd(
                q, layer["k_cache"], layer["v_cache"], out, cu_seqlens_q, cu_seqlens_k, used, None, layer["table"],
                None, 1, args.cache, 0.0, scale, False, True, -1, -1, 0.0, False, None)
            x = x + out.reshape(args.batch, hidden) @ layer["proj"]
        return x

    def timed_step(x):
        if device.type != "cuda":
            start = time.perf_counter()
            step(x)
            return time.perf_counter() - start
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        step(x)
        end.record()
        end.synchronize()  # the job's stream only: capture's side stream may still be copying
        return begin.elapsed_time(end) / 1e3

    with torch.inference_mode():
        for _ in range(args.warmup):
            timed_step(x)
        step_s = [timed_step(x) for _ in range(args.steps)]
    first = layers[0]
    call_bytes = sum(t.nbytes for t in (first["k_cache"], first["v_cache"], first["table"], out, used, cu_seqlens_q,
                                        cu_seqlens_k)) + args.batch * hidden * x.element_size()
    print(json.dumps({"step_s": step_s, "calls_per_step": args.layers, "warmup_steps": args.warmup,
                      "bytes_per_call": call_bytes,
                      "clone_gb_per_s": clone_gb_per_s(device, min(call_bytes, 1 << 30)),
                      "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}))


if __name__ == "__main__":
    main()
