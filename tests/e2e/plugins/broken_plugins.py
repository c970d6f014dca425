"""Plug-in kernels that go wrong in each way attnreplay must isolate."""
import torch

import attnreplay_plugin as ar

CAPS = dict(device="cpu", dtypes=("float32",))


def sdpa(inputs):
    return torch.nn.functional.scaled_dot_product_attention(inputs.q, inputs.k, inputs.v, scale=inputs.spec.scale)


@ar.kernel("py-raises", **CAPS)
def raises(inputs):
    raise ValueError("deliberately broken kernel")


@ar.kernel("py-wrong-shape", **CAPS)
def wrong_shape(inputs):
    return sdpa(inputs)[:, :, :1]


@ar.kernel("py-wrong-dtype", **CAPS)
def wrong_dtype(inputs):
    return sdpa(inputs).to(torch.float64)


@ar.kernel("py-not-a-tensor", **CAPS)
def not_a_tensor(inputs):
    return [1, 2, 3]


@ar.kernel("py-writes-input", **CAPS)
def writes_input(inputs):
    inputs.k.mul_(3.0)
    return sdpa(inputs)


class SupportsRaises(ar.Kernel):
    name = "py-supports-raises"
    device = "cpu"
    dtypes = ("float32",)

    def supports(self, spec):
        raise KeyError("no such field")

    def run(self, inputs):
        return sdpa(inputs)


ar.register(SupportsRaises())
