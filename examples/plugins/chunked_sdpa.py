"""Attention in plain torch, a block of query rows at a time, as an attnreplay plug-in kernel: the
kind of kernel a model author writes to bound memory, and a template that runs on either device.

    attnreplay run caps/ --kernel-module examples/plugins/chunked_sdpa.py --kernels chunked-sdpa,torch-math

Scores and softmax in fp32 whatever the inputs' dtype; takes bool and float masks, both causal
alignments, and any head dims.
"""
import torch

import attnreplay_plugin as ar

ROWS = 256  # query rows per block: the score matrix held at once is ROWS x seq_kv


class ChunkedSdpa(ar.Kernel):
    name = "chunked-sdpa"
    summary = "plain-torch attention, 256 query rows at a time, fp32 softmax (examples/plugins/chunked_sdpa.py)"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    layout = "bhsd"
    dtypes = ("float32", "float16", "bfloat16")
    different_vo = True
    masks = ("bool", "float")
    causal_alignments = ("top_left", "bottom_right")

    def run(self, inputs):
        q, k, v, mask, spec = inputs.q, inputs.k, inputs.v, inputs.mask, inputs.spec
        out = torch.empty(q.shape[:3] + (v.shape[3],), dtype=q.dtype, device=q.device)
        keys_t = k.float().transpose(-1, -2)
        values = v.float()
        shift = spec.seq_kv - spec.seq_q if spec.causal_alignment == "bottom_right" else 0
        for start in range(0, spec.seq_q, ROWS):
            rows = slice(start, min(start + ROWS, spec.seq_q))
            scores = q[:, :, rows].float() @ keys_t * spec.scale
            if mask is not None:
                block = mask.expand(spec.batch, spec.heads_q, spec.seq_q, spec.seq_kv)[:, :, rows]
                scores = scores.masked_fill(~block, float("-inf")) if block.dtype == torch.bool else scores + block
            if spec.is_causal:
                row = torch.arange(rows.start, rows.stop, device=q.device)[:, None]
                key = torch.arange(spec.seq_kv, device=q.device)[None, :]
                scores = scores.masked_fill(key > row + shift, float("-inf"))
            # A row that sees no key gives 0, as the reference does, not NaN.
            weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
            out[:, :, rows] = (weights @ values).to(q.dtype)
        return out


ar.register(ChunkedSdpa())
