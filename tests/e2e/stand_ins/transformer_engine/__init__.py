"""Test stand-in for Transformer Engine, not the library: `transformer_engine.pytorch.DotProductAttention`
with TE's signature and conventions, computed with torch in float64 on the CPU (see
transformer_engine/pytorch/__init__.py)."""
__version__ = "2.20.0"
