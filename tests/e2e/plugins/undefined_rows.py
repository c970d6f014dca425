"""A CPU kernel that behaves as torch's cuDNN backend does with a padding mask: exact attention where
a row sees a key, and values of its own (here attention over every key, plus a NaN) in the rows that
see none, which have no defined output. tests/e2e/test_rows_without_a_key.py judges it."""
import torch

import attnreplay_plugin as ar


class UndefinedRows(ar.Kernel):
    name = "undefined-rows"
    summary = "exact SDPA; attention over every key, and a NaN, in rows that see no key (tests/e2e/plugins)"
    device = "cpu"
    layout = "bhsd"
    dtypes = ("float32",)
    masks = ("bool",)

    def run(self, inputs):
        spec = inputs.spec
        q, k, v, mask = inputs.q, inputs.k, inputs.v, inputs.mask
        visible = mask.expand(spec.batch, spec.heads_q, spec.seq_q, spec.seq_kv)
        sees_key = visible.any(dim=-1, keepdim=True)
        # Rows without a key attend to every key: cuDNN's output there.
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=visible | ~sees_key,
                                                               scale=spec.scale)
        undefined = (~sees_key).expand_as(out[..., :1])
        first = undefined.nonzero()[0]
        out = out.clone()
        out[first[0], first[1], first[2], 0] = float("nan")
        return out


ar.register(UndefinedRows())
