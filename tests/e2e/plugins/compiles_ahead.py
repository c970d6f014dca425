"""A CPU kernel that compiles per kind of call, as flex-attention does on the GPU: precompile(spec)
takes COMPILE_S per kind (a sleep, standing for a compiler), warm_up() compiles only a kind not
compiled ahead and says so, and each run is plain SDPA. Its kinds include autograd's mode, as
torch.compile's guards do. tests/e2e/test_compile_ahead.py."""
import time

import torch

import attnreplay_plugin as ar

COMPILE_S = 1.0


class CompilesAhead(ar.Kernel):
    name = "compiles-ahead"
    summary = "SDPA that compiles per kind of call (tests/e2e/plugins/compiles_ahead.py)"
    device = "cpu"
    dtypes = ("float32",)

    def __init__(self):
        self.compiled = set()

    @staticmethod
    def kind(spec):
        # As torch.compile guards on it: a kind compiled under autograd is not the kind a call
        # without it runs.
        return spec.head_dim_qk, spec.is_causal, torch.is_grad_enabled()

    def precompile(self, spec):
        if self.kind(spec) in self.compiled:
            return None
        time.sleep(COMPILE_S)
        self.compiled.add(self.kind(spec))
        return f"d{spec.head_dim_qk}{', causal' if spec.is_causal else ''}"

    def warm_up(self, prepared):
        if self.kind(prepared.spec) in self.compiled:
            return False
        time.sleep(COMPILE_S)
        self.compiled.add(self.kind(prepared.spec))
        return True

    def run(self, inputs):
        return torch.nn.functional.scaled_dot_product_attention(inputs.q, inputs.k, inputs.v,
                                                                is_causal=inputs.spec.is_causal,
                                                                scale=inputs.spec.scale)


ar.register(CompilesAhead())
