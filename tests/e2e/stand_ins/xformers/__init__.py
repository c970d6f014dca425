"""Test stand-in for xFormers, not the library: `xformers.ops.memory_efficient_attention` and the
causal biases of `xformers.ops.fmha.attn_bias`, with xFormers' conventions, computed with torch in
float64 on the CPU (see xformers/ops/fmha/__init__.py)."""
__version__ = "0.0.35"
