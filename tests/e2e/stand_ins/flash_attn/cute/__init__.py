"""Test stand-in for FlashAttention-4's `flash_attn.cute` (PyPI flash-attn-4), not the library: see
flash_attn/cute/interface.py."""
