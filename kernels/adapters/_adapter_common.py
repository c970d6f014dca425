"""What the library adapters in this folder share: mask and causal-diagonal conversions, the GPU's
compute capability, version strings, and libraries' (out, lse) returns.

Not an adapter: attnreplay skips files whose name starts with an underscore, and the adapters import
this one as a neighbour. The conventions converted from are attnreplay's (docs/format.md): a bool
mask is True where the query may attend, a float mask is added to the scaled scores, both broadcast
to (batch, heads_q, seq_q, seq_kv); causal keeps key j for query i when j <= i + offset, where the
offset is 0 for top_left (torch SDPA) and seq_kv - seq_q for bottom_right (flash-attn).
"""

import contextlib
import fcntl
import hashlib
import os

import torch


def gpu_capability(kernel):
    """The (major, minor) of the GPU a kernel runs on, asked of torch once; a value preset on the
    kernel (tests do) stands. None off the GPU."""
    if kernel.compute_capability is None and kernel.device == "cuda":
        kernel.compute_capability = torch.cuda.get_device_capability()
    return tuple(kernel.compute_capability) if kernel.compute_capability else None


def output_only(result):
    """A library's output whether the installed version returns it alone or as (out, softmax_lse)."""
    return result[0] if isinstance(result, (tuple, list)) else result


def causal_offset(spec) -> int:
    return spec.seq_kv - spec.seq_q if spec.causal_alignment == "bottom_right" else 0


def causal_visible(spec, device) -> torch.Tensor:
    """(seq_q, seq_kv) bool, True where the call's causal diagonal lets the query see the key."""
    rows = torch.arange(spec.seq_q, device=device)[:, None]
    cols = torch.arange(spec.seq_kv, device=device)[None, :]
    return cols <= rows + causal_offset(spec)


def as_4d(mask: torch.Tensor) -> torch.Tensor:
    """The mask with leading size-1 dims up to 4 (a view): libraries index it as (b, h, q, k)."""
    return mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))


def visible_keys(mask: torch.Tensor, spec) -> torch.Tensor:
    """A bool mask as 4-D bool, True = may attend, with the causal diagonal folded in when the call
    is causal (for libraries that take either a mask or causal, not both)."""
    visible = as_4d(mask)
    if spec.is_causal:
        visible = visible & causal_visible(spec, mask.device)
    return visible


def additive_bias(mask: torch.Tensor, spec, dtype) -> torch.Tensor:
    """Either mask kind as a 4-D float bias in `dtype` (0 / -inf for a bool mask; a float mask as it
    is, converted to `dtype`), with the causal diagonal folded in as -inf when the call is causal."""
    mask = as_4d(mask)
    minus_inf = torch.tensor(float("-inf"), dtype=dtype, device=mask.device)
    if mask.dtype == torch.bool:
        bias = torch.where(mask, torch.tensor(0, dtype=dtype, device=mask.device), minus_inf)
    else:
        bias = mask.to(dtype)
    if spec.is_causal:
        bias = torch.where(causal_visible(spec, mask.device), bias, minus_inf)
    return bias


def leading_dims_vary(spec) -> tuple:
    """(varies over batch, varies over heads) for the call's mask, from its recorded shape."""
    shape = (1,) * (4 - len(spec.mask_shape)) + tuple(spec.mask_shape)
    return shape[0] > 1, shape[1] > 1


def version_tuple(text: str) -> tuple:
    """'2.8.3.post1' -> (2, 8, 3): the leading numeric fields of a version string."""
    numbers = []
    for field in str(text).split("."):
        digits = ""
        for ch in field:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        numbers.append(int(digits))
        if digits != field:
            break
    return tuple(numbers)


@contextlib.contextmanager
def compile_lock(kind: str):
    """One process at a time on this machine compiles a kind of call (torch.compile'd adapters): under
    --gpus or a launcher, the first rank compiles and the others, waiting, then find torch's on-disk
    caches (inductor's, Triton's) warm: no kind is compiled cold twice in a run."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    folder = os.path.join(cache_dir(), "attnreplay-compile-locks")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, hashlib.sha1(kind.encode()).hexdigest() + ".lock")
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def has_window(spec) -> bool:
    return spec.window_left is not None or spec.window_right is not None


def bottom_right_problem(spec, library: str):
    """Why a library whose windows and ALiBi distances are aligned bottom-right (flash-attn's,
    FlashInfer's) cannot take the call's, or None: a top-left call means another diagonal wherever
    seq_q != seq_kv, in any sequence."""
    uses = (("a sliding window", has_window(spec)), ("ALiBi", spec.alibi_shape is not None))
    aligned = [name for name, present in uses if present]
    if not aligned or spec.causal_alignment == "bottom_right":
        return None
    if all(q == k for q, k in spec.sequence_lengths):
        return None
    what = " and ".join(aligned)
    return (f"{what} aligned top_left with seq_q != seq_kv: {library} aligns them bottom-right "
            f"(query i at key i + seq_kv - seq_q)")


def flash_attn_window(spec, unbounded):
    """window_size as flash-attn takes it: (left, right), `unbounded` (-1, or None for FlashAttention-4)
    on a side the call leaves open. Its causal flag then clips the right side to the diagonal, as the
    record's causality does."""
    left = unbounded if spec.window_left is None else spec.window_left
    right = unbounded if spec.window_right is None else spec.window_right
    return left, right
