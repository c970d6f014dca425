"""Two plug-in kernels for `attnreplay compare`'s test: 'steady', SDPA and a sleep of 5 ms a run (a
time that a loaded 2-core machine does not move by a third between runs, as it moves a bare 0.06 ms
SDPA), and 'probe', whose
change between runs the environment sets: ATTNREPLAY_TEST_PROBE=slow sleeps 30 ms a run,
=noisy adds noise of 1e-2 of the output's scale, =sleep:MS sleeps MS milliseconds a run (a kernel of
a known time), anything else is plain SDPA too."""
import os
import time

import torch

import attnreplay_plugin as ar


def sdpa(inputs):
    spec = inputs.spec
    return torch.nn.functional.scaled_dot_product_attention(inputs.q, inputs.k, inputs.v, attn_mask=inputs.mask,
                                                            is_causal=spec.is_causal, scale=spec.scale)


class Steady(ar.Kernel):
    name = "steady"
    summary = "torch SDPA and a 5 ms sleep, the same in every run (tests/e2e/plugins/changed_kernels.py)"
    device = "cpu"
    layout = "bhsd"
    dtypes = ("float32",)

    def run(self, inputs):
        out = sdpa(inputs)
        time.sleep(0.005)
        return out


class Probe(Steady):
    name = "probe"
    summary = "torch SDPA, slowed or made noisy by $ATTNREPLAY_TEST_PROBE (tests/e2e/plugins/changed_kernels.py)"

    def run(self, inputs):
        out = sdpa(inputs)
        change = os.environ.get("ATTNREPLAY_TEST_PROBE", "")
        if change == "slow":
            time.sleep(0.03)
        if change.startswith("sleep:"):
            time.sleep(float(change.split(":")[1]) / 1e3)
        if change == "noisy":
            generator = torch.Generator().manual_seed(0)
            out = out + 1e-2 * out.abs().mean() * torch.randn(out.shape, generator=generator, dtype=out.dtype)
        return out


ar.register(Steady())
ar.register(Probe())
