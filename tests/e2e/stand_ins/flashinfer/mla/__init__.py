"""Test stand-in, not FlashInfer: flashinfer.mla as the package lays it out (mla/_core.py)."""
from ._core import BatchMLAPagedAttentionWrapper  # noqa: F401
