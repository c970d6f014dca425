"""Plug-in kernels in plain torch, as a user writes them: one function, one class with a
preparation step."""
import time

import torch

import attnreplay_plugin as ar


@ar.kernel("py-sdpa", device="cpu", dtypes=("float32", "float64", "bfloat16"), masks=("bool", "float"),
           causal_alignments=("top_left",), native_gqa=True, different_vo=True)
def sdpa(inputs):
    """torch SDPA called from a Python plug-in"""
    spec = inputs.spec
    return torch.nn.functional.scaled_dot_product_attention(
        inputs.q, inputs.k, inputs.v, attn_mask=inputs.mask, is_causal=spec.is_causal, scale=spec.scale,
        enable_gqa=spec.is_gqa)


class Fp64Bshd(ar.Kernel):
    """Wants BSHD; its preparation makes fp64 BHSD copies, which run() then reads."""

    name = "py-fp64-prepared"
    summary = "softmax(QK^T)V in fp64 after a timed preparation"
    device = "cpu"
    layout = "bshd"
    dtypes = ("float32",)
    causal_alignments = ()

    def supports(self, spec):
        return "declines calls longer than 4096 keys" if spec.seq_kv > 4096 else None

    def prepare(self, inputs):
        return tuple(t.transpose(1, 2).to(torch.float64) for t in (inputs.q, inputs.k, inputs.v)) + (inputs.spec,)

    def run(self, prepared):
        q, k, v, spec = prepared
        p = torch.softmax(q @ k.transpose(-1, -2) * spec.scale, dim=-1)
        return (p @ v).transpose(1, 2).to(torch.float32)


ar.register(Fp64Bshd())


class Fp64AsLibraryCall(Fp64Bshd):
    """The same as a library's function that does its preparation inside the call (5 ms of it):
    the headline is the whole call, the kernel alone beside it."""

    name = "py-fp64-call"
    headline = "call"

    def prepare(self, inputs):
        time.sleep(0.005)
        return super().prepare(inputs)


class Fp64WithSetUp(Fp64Bshd):
    """The same as a library's function whose preparation is set-up a model does once: the
    headline is run() alone, the set-up timed in beside it."""

    name = "py-fp64-run"
    headline = "run"


ar.register(Fp64AsLibraryCall())
ar.register(Fp64WithSetUp())


@ar.kernel("py-declines-late", device="cpu", dtypes=("float32",))
def declines_late(inputs):
    """declines once it sees the tensors, as a library's dispatcher does"""
    raise ar.NotSupported("no implementation for these strides")
