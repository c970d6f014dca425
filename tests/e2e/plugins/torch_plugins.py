"""Plug-in kernels in plain torch, as a user writes them: one function, one class with a
preparation step."""
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


@ar.kernel("py-declines-late", device="cpu", dtypes=("float32",))
def declines_late(inputs):
    """declines once it sees the tensors, as a library's dispatcher does"""
    raise ar.NotSupported("no implementation for these strides")
