"""Test stand-in for `xformers.ops`, not the library: re-exports the stand-in's
memory_efficient_attention and LowerTriangularMask, as xformers.ops does."""
from .fmha import LowerTriangularMask, memory_efficient_attention  # noqa: F401
from .fmha import attn_bias as _attn_bias  # noqa: F401
