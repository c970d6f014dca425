"""A CUDA kernel whose outputs hold NaN and Inf among finite values, and one far off in a few rows:
what the comparison with the reference must count, leave out and place (test_gpu.py)."""
import torch

import attnreplay_plugin as ar


@ar.kernel("sdpa-nonfinite", device="cuda", dtypes=("float16", "bfloat16", "float32", "float64"), masks=("bool",),
           causal_alignments=("top_left",), native_gqa=True)
def sdpa_nonfinite(inputs):
    """torch SDPA with NaN, +Inf and -Inf at fixed strides and every 500th row off by 0.25"""
    spec = inputs.spec
    out = torch.nn.functional.scaled_dot_product_attention(
        inputs.q, inputs.k, inputs.v, attn_mask=inputs.mask, is_causal=spec.is_causal, scale=spec.scale,
        enable_gqa=spec.is_gqa).contiguous()  # a backend may give a strided view (fp32 does)
    flat = out.view(-1)
    flat[3::997] = float("nan")
    flat[11::1511] = float("inf")
    flat[17::2003] = float("-inf")
    out[:, :, ::500] += 0.25
    return out
