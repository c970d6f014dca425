"""Plug-in kernels that take a ragged batch as one (layout "thd"), on the CPU, for
tests/e2e/test_ragged_batches.py: each computes every sequence in plain torch, bottom-right causal.

- varlen-rows: packed keys (a paged batch comes gathered), K and V expanded for GQA;
- paged-rows: the KV cache's pages with the block table and seqused_k, GQA natively."""
import math

import attnreplay_plugin as ar
import torch


def attend(q, k, v, scale, causal):
    """One sequence: q (s_q, h, d), k and v (s_k, h, d)."""
    scores = torch.einsum("qhd,khd->hqk", q.double(), k.double()) * scale
    if causal:
        rows = torch.arange(q.shape[0])[:, None] + (k.shape[0] - q.shape[0])
        scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > rows, -math.inf)
    seen = torch.isfinite(scores.amax(-1, keepdim=True))
    weights = torch.softmax(torch.where(seen, scores, torch.zeros_like(scores)), -1) * seen
    return torch.einsum("hqk,khd->qhd", weights, v.double())


class VarlenRows(ar.Kernel):
    name = "varlen-rows"
    summary = "ragged batch as packed rows, every sequence in plain torch (test plug-in)"
    device = "cpu"
    layout = "thd"
    dtypes = ("float32",)
    causal_alignments = ("bottom_right",)

    def run(self, inputs):
        assert inputs.q.dim() == 3 and inputs.k.dim() == 3 and inputs.block_table is None, inputs.k.shape
        out = torch.zeros(inputs.q.shape[0], inputs.q.shape[1], inputs.v.shape[-1], dtype=torch.float64)
        cu_q, cu_k = inputs.cu_seqlens_q.tolist(), inputs.cu_seqlens_k.tolist()
        used = inputs.seqused_k.tolist() if inputs.seqused_k is not None else None
        for b in range(len(cu_q) - 1):
            keys = used[b] if used else cu_k[b + 1] - cu_k[b]
            if cu_q[b + 1] > cu_q[b] and keys:
                k, v = (t[cu_k[b]:cu_k[b] + keys] for t in (inputs.k, inputs.v))
                out[cu_q[b]:cu_q[b + 1]] = attend(inputs.q[cu_q[b]:cu_q[b + 1]], k, v, inputs.spec.scale,
                                                  inputs.spec.is_causal)
        return out.float()


class PagedRows(VarlenRows):
    name = "paged-rows"
    summary = "paged batch read through its block table, every sequence in plain torch (test plug-in)"
    paged = True
    native_gqa = True

    def supports(self, spec):
        return None if spec.page_size else "takes paged batches"

    def run(self, inputs):
        assert inputs.k.dim() == 4 and inputs.cu_seqlens_k is None, inputs.k.shape
        group = inputs.spec.heads_q // inputs.spec.heads_kv
        out = torch.zeros(inputs.q.shape[0], inputs.q.shape[1], inputs.v.shape[-1], dtype=torch.float64)
        cu_q = inputs.cu_seqlens_q.tolist()
        for b, keys in enumerate(inputs.seqused_k.tolist()):
            pages = inputs.block_table[b, :(keys + inputs.spec.page_size - 1) // inputs.spec.page_size].long()
            k, v = (t[pages].flatten(0, 1)[:keys].repeat_interleave(group, dim=1) for t in (inputs.k, inputs.v))
            if cu_q[b + 1] > cu_q[b] and keys:
                out[cu_q[b]:cu_q[b + 1]] = attend(inputs.q[cu_q[b]:cu_q[b + 1]], k, v, inputs.spec.scale,
                                                  inputs.spec.is_causal)
        return out.float()


ar.register(VarlenRows())
ar.register(PagedRows())
