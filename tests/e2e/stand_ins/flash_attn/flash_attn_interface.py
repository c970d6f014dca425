"""Test stand-in for flash_attn.flash_attn_interface (flash-attn 2.8), not the library:
flash_attn_with_kvcache with flash-attn's signature and conventions, computed with torch in float64
on the CPU. Like the real one, it is a Python function that reaches no dispatcher op.

q (batch, seq_q, heads, dim) over a cache: dense (batch, seq_cache, heads_kv, dim), or paged
(blocks, block_size, heads_kv, dim) with block_table (batch, blocks a sequence). k and v, when
given (batch, seq_new, heads_kv, dim), are first written into the cache in place at positions
cache_seqlens[b].., and sequence b then attends to its first cache_seqlens[b] + seq_new keys
(all the cache when cache_seqlens is None). Causality and the window (left, right) align
bottom-right; softcap caps the scaled scores. Rotary embedding, ALiBi, cache_batch_idx and
cache_leftpad raise; fp16 and bf16 only, on any device."""
import torch

from _stand_in_math import attention_fp64


def _positions(block_table, b, first, count, block_size):
    """(block, offset) of cache positions first .. first + count of sequence b."""
    positions = torch.arange(first, first + count)
    if block_table is None:
        return None, positions
    return block_table[b, positions // block_size].long(), positions % block_size


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError("FlashAttention only support fp16 and bf16 data type")
    if rotary_cos is not None or alibi_slopes is not None or cache_batch_idx is not None or cache_leftpad is not None:
        raise NotImplementedError("the stand-in does not emulate rotary embedding, ALiBi or cache indexing")
    batch, seq_q, heads, dim = q.shape
    paged = block_table is not None
    block_size = k_cache.shape[1]
    capacity = block_table.shape[1] * block_size if paged else k_cache.shape[1]
    if cache_seqlens is None:
        lengths = [capacity] * batch
    elif isinstance(cache_seqlens, int):
        lengths = [cache_seqlens] * batch
    else:
        lengths = [int(n) for n in cache_seqlens]
    seq_new = 0 if k is None else k.shape[1]
    scale = softmax_scale if softmax_scale is not None else dim ** -0.5
    out = torch.empty_like(q)
    for b in range(batch):
        if k is not None:
            blocks, offsets = _positions(block_table, b, lengths[b], seq_new, block_size)
            if paged:
                k_cache[blocks, offsets] = k[b]
                v_cache[blocks, offsets] = v[b]
            else:
                k_cache[b, offsets] = k[b]
                v_cache[b, offsets] = v[b]
        n_k = lengths[b] + seq_new
        blocks, offsets = _positions(block_table, b, 0, n_k, block_size)
        keys = k_cache[blocks, offsets] if paged else k_cache[b, :n_k]
        values = v_cache[blocks, offsets] if paged else v_cache[b, :n_k]
        rows = torch.arange(seq_q, device=q.device)[:, None] + (n_k - seq_q)
        cols = torch.arange(n_k, device=q.device)[None, :]
        visible = torch.ones(seq_q, n_k, dtype=torch.bool, device=q.device)
        if causal:
            visible &= cols <= rows
        if window_size[0] >= 0:
            visible &= cols >= rows - window_size[0]
        if window_size[1] >= 0:
            visible &= cols <= rows + window_size[1]
        attended = attention_fp64(q[b].transpose(0, 1)[None], keys.transpose(0, 1)[None],
                                  values.transpose(0, 1)[None], scale, visible, softcap=softcap)
        out[b] = attended[0].transpose(0, 1).to(q.dtype)
    return (out, torch.zeros(batch, heads, seq_q, device=q.device)) if return_softmax_lse else out
