"""The benchmarks' captures, as folders of attnreplay's .pt calls (docs/format.md): torch.save
writes them at disk speed, where the HDF5 writer in Python spends seconds a call on its content
hashes."""
import os

import torch

# Small calls (about 1.5 MB each, fp16), where timing dominates a replay: (b, h, s, d, causal).
SMALL_SHAPES = [(1, 8, 512, 128, False), (2, 4, 1024, 64, False), (1, 8, 1024, 128, True), (4, 4, 256, 128, False)]


def save_call(folder, index, q, k, v, *, is_causal=False, op="", out=None):
    """One call in bhsd with the default scale, as `call_<index>.pt` in `folder`; returns its path."""
    path = os.path.join(folder, f"call_{index:06d}.pt")
    torch.save({"format": "attnreplay.call", "schema_version": 1, "call_index": index, "op": op, "backend": "",
                "layout": "bhsd", "is_causal": is_causal, "causal_alignment": "top_left", "scale": None,
                "dropout_p": 0.0, "enable_gqa": False, "q": q, "k": k, "v": v, "mask": None, "out": out,
                "metadata": {}}, path)
    return path


def write_small_shapes(folder, calls, seed=0):
    """`calls` fp16 calls going round SMALL_SHAPES, every call its own random values; returns the bytes written."""
    os.makedirs(folder, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    size = 0
    for index in range(calls):
        b, h, s, d, causal = SMALL_SHAPES[index % len(SMALL_SHAPES)]
        q, k, v = (torch.randn(b, h, s, d, generator=generator).half() for _ in range(3))
        size += os.path.getsize(save_call(folder, index, q, k, v, is_causal=causal))
    return size
