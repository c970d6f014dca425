"""Test stand-in for FlashInfer, not the library: its attention entry points with FlashInfer's
signatures and conventions, computed with torch in float64 on the CPU, laid out in modules as the
real package is (flashinfer/prefill.py, decode.py, quantization), so that what finds them there in
the real package finds them here.

- prefill.py: single_prefill_with_kv_cache, BatchPrefillWithPagedKVCacheWrapper,
  BatchPrefillWithRaggedKVCacheWrapper; decode.py: single_decode_with_kv_cache,
  BatchDecodeWithPagedKVCacheWrapper; mla/_core.py: BatchMLAPagedAttentionWrapper (laid out as
  FlashInfer's main branch lays it out); quantization.py: packbits.
- The last single_prefill_with_kv_cache call's arguments are in LAST_CALL, the last batch wrapper
  plan's in _batch.LAST_PLAN.
"""
__version__ = "0.6.18"

import torch  # noqa: F401 - first, as the real package's first submodule (jit) imports it

from .decode import BatchDecodeWithPagedKVCacheWrapper, single_decode_with_kv_cache
from .mla import BatchMLAPagedAttentionWrapper
from .prefill import (LAST_CALL, BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper,
                      single_prefill_with_kv_cache)
from .quantization import packbits
