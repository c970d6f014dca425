"""Library adapters (kernels/adapters/, docs/adapters.md), on the CPU: each adapter run against the
stand-in of its library (tests/e2e/stand_ins/, which follows that library's own conventions and
rejects what it rejects) and judged against an independent fp64 computation of attnreplay's call
semantics (torch SDPA in float64 with an explicit mask; for ragged and paged batches, each sequence's
own keys, causal bottom-right within it); its declines and their reasons; and, with the libraries
absent, every adapter's kernels listed as unavailable with the import error.

flex-attention runs real torch code (there is no stand-in for it), uncompiled: torch.compile on the
CPU needs a C++ toolchain and minutes; what compilation changes is not the mapping tested here.
"""

import dataclasses
import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import SOURCE_DIR

STAND_INS = Path(__file__).resolve().parent / "stand_ins"
ADAPTERS = Path(SOURCE_DIR) / "kernels" / "adapters"
PLUGIN_API = Path(SOURCE_DIR) / "kernels" / "python"

# Per kernel: the dtype it is run in here, its relative L2 error bound against fp64 (the output's
# rounding, plus INT8/FP8 quantization where it has them), where its stand-in records the softmax
# scale it was given, and the quantization flags it needs to run at all.
CASES = {
    "flash-attn-2": dict(dtype="bfloat16", tolerance=1e-2, scale_at=("flash_attn", "softmax_scale")),
    "flash-attn-3": dict(dtype="float16", tolerance=2e-3, scale_at=("flash_attn_interface", "softmax_scale")),
    "flash-attn-3-fp8": dict(dtype="bfloat16", tolerance=8e-2, scale_at=("flash_attn_interface", "softmax_scale")),
    "flash-attn-4": dict(dtype="bfloat16", tolerance=1e-2, scale_at=("flash_attn.cute.interface", "softmax_scale")),
    "xformers": dict(dtype="float32", tolerance=1e-5, scale_at=("xformers.ops.fmha", "scale")),
    "flex-attention": dict(dtype="float32", tolerance=1e-5, scale_at=None),
    "flashinfer-prefill": dict(dtype="float16", tolerance=2e-3, scale_at=("flashinfer", "sm_scale")),
    "transformer-engine": dict(dtype="bfloat16", tolerance=1e-2, scale_at=None),
    "sageattn-triton": dict(dtype="float16", tolerance=3e-2, scale_at=("sageattention", "sm_scale"),
                            quant={"quant_gran": "per_block"}),
    "sage2-cuda": dict(dtype="bfloat16", tolerance=4e-2, scale_at=("sageattention._qattn_sm90", "sm_scale")),
}
SCALE = 0.3  # not 1/sqrt(head_dim) of any shape here, so a dropped scale shows
QUANT_DEFAULTS = dict(quant_gran="per_warp", k_smooth=True, pv_accum_dtype="fp32+fp32", fp8_scale="per_head")


@pytest.fixture(scope="module")
def plugin():
    for path in (STAND_INS, PLUGIN_API):
        sys.path.insert(0, str(path))
    import attnreplay_plugin

    failures = attnreplay_plugin._load_adapters(str(ADAPTERS))
    assert failures == [], failures
    yield attnreplay_plugin
    for path in (STAND_INS, PLUGIN_API):
        sys.path.remove(str(path))


@pytest.fixture
def kernels(plugin):
    """The registered adapters, set up to run on the CPU against the stand-ins."""
    found = {k.name: k for k, _ in plugin._entries()}
    for k in found.values():
        k.device = "cpu"
    found["flex-attention"].compile = False
    found["sage2-cuda"].compute_capability = (9, 0)
    found["flash-attn-4"].compute_capability = (9, 0)
    found["flash-attn-4-varlen"].compute_capability = (9, 0)
    found["flash-attn-3"].compute_capability = (9, 0)
    return found


def make_call(plugin, kernel, *, batch=2, heads_q=4, heads_kv=4, seq_q=40, seq_kv=72, head_dim=64, head_dim_vo=None,
              causal=None, mask=None, dtype=None, quant=None, seed=0):
    """(spec, q, k, v, mask) of one call; q, k, v (b, h, s, d) as attnreplay hands them over."""
    case = CASES[kernel.name]
    dtype = dtype or case["dtype"]
    head_dim_vo = head_dim_vo or head_dim
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads_q, seq_q, head_dim, generator=generator).to(getattr(torch, dtype))
    k = torch.randn(batch, heads_kv, seq_kv, head_dim, generator=generator).to(getattr(torch, dtype))
    v = torch.randn(batch, heads_kv, seq_kv, head_dim_vo, generator=generator).to(getattr(torch, dtype))
    fields = dict(index=0, op="test", dtype=dtype, model_layout="bhsd", batch=batch, heads_q=heads_q, heads_kv=heads_kv,
                  seq_q=seq_q, seq_kv=seq_kv, head_dim_qk=head_dim, head_dim_vo=head_dim_vo,
                  is_causal=causal is not None, causal_alignment=causal or "top_left", scale=SCALE,
                  mask_kind=None if mask is None else ("bool" if mask.dtype == torch.bool else "float"),
                  mask_shape=None if mask is None else tuple(mask.shape), metadata={},
                  quant={**QUANT_DEFAULTS, **case.get("quant", {}), **(quant or {})})
    return plugin._make_spec(kernel, fields), q, k, v, mask


def reference(spec, q, k, v, mask):
    """attnreplay's semantics in fp64: SDPA's math with K, V repeated for GQA, the causal diagonal of
    the call's alignment and its mask (bool: True = may attend; float: added to the scores)."""
    group = spec.heads_q // spec.heads_kv
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    bias = torch.zeros(spec.seq_q, spec.seq_kv, dtype=torch.float64)
    if spec.is_causal:
        offset = 0 if spec.causal_alignment == "top_left" else spec.seq_kv - spec.seq_q
        hidden = torch.ones(spec.seq_q, spec.seq_kv, dtype=torch.bool).triu(offset + 1)
        bias = bias.masked_fill(hidden, float("-inf"))
    if mask is not None:
        bias = bias + (mask.to(torch.float64) if mask.dtype != torch.bool
                       else torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf")))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=spec.scale)


def run_call(plugin, kernel, spec, q, k, v, mask):
    assert kernel.decline_reason(spec) is None, kernel.decline_reason(spec)
    prepared = plugin._Prepared(kernel, spec, q, k, v, mask)
    prepared.run()
    assert prepared.problem() is None, prepared.problem()
    return prepared.output_bhsd()


def assert_close(kernel, spec, out, q, k, v, mask):
    want = reference(spec, q, k, v, mask)
    assert out.shape == want.shape
    assert torch.isfinite(out.to(torch.float64)).all()
    error = (out.to(torch.float64) - want).norm() / want.norm()
    assert error < CASES[kernel.name]["tolerance"], f"{kernel.name}: relative L2 error {error:.3g}"


def check_call(plugin, kernel, **call):
    spec, q, k, v, mask = make_call(plugin, kernel, **call)
    assert_close(kernel, spec, run_call(plugin, kernel, spec, q, k, v, mask), q, k, v, mask)
    return spec


def random_mask(kind, batch, heads, seq_q, seq_kv, seed=1):
    """A bool mask varying over batch (True = may attend, every row keeping its first key), or a
    float mask varying over heads."""
    generator = torch.Generator().manual_seed(seed)
    if kind == "bool":
        mask = torch.rand(batch, 1, seq_q, seq_kv, generator=generator) > 0.3
        mask[..., 0] = True
        return mask
    return torch.randn(1, heads, seq_q, seq_kv, generator=generator)


def last_call(module):
    return importlib.import_module(module).LAST_CALL


DENSE = sorted(CASES)
# The adapters of layout "thd", tested apart below (they take ragged and paged batches only).
RAGGED = ["flash-attn-4-varlen", "flashinfer-batch-prefill", "flashinfer-decode"]
ALL = sorted(DENSE + RAGGED)


def test_every_adapter_registers_with_its_stand_in(kernels):
    assert sorted(kernels) == ALL


@pytest.mark.parametrize("name", DENSE)
def test_plain_cross_attention_with_explicit_scale(plugin, kernels, name):
    batch = 1 if name == "flashinfer-prefill" else 2
    check_call(plugin, kernels[name], batch=batch)
    if CASES[name]["scale_at"]:
        module, key = CASES[name]["scale_at"]
        assert last_call(module)[key] == SCALE


@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
@pytest.mark.parametrize("name", DENSE)
def test_causal_alignment_with_seq_q_below_seq_kv(plugin, kernels, name, alignment):
    kernel = kernels[name]
    batch = 1 if name == "flashinfer-prefill" else 2
    if alignment in kernel.causal_alignments:
        check_call(plugin, kernel, batch=batch, causal=alignment)
    else:
        spec = make_call(plugin, kernel, batch=batch, causal=alignment)[0]
        reason = kernel.decline_reason(spec)
        assert reason and alignment in reason and "seq_q 40 != seq_kv 72" in reason, reason
        # Equal lengths put both diagonals in the same place: taken.
        check_call(plugin, kernel, batch=batch, seq_q=48, seq_kv=48, causal=alignment)


@pytest.mark.parametrize("name", DENSE)
def test_gqa(plugin, kernels, name):
    kernel = kernels[name]
    batch = 1 if name == "flashinfer-prefill" else 2
    causal = kernel.causal_alignments[0]
    check_call(plugin, kernel, batch=batch, heads_q=4, heads_kv=2, causal=causal)
    assert kernel.native_gqa  # every library here takes K and V with fewer heads


def test_gqa_reaches_the_libraries_with_fewer_kv_heads(plugin, kernels):
    check_call(plugin, kernels["flash-attn-2"], heads_q=4, heads_kv=2)
    assert last_call("flash_attn")["k.shape"] == (2, 72, 2, 64)
    check_call(plugin, kernels["xformers"], heads_q=4, heads_kv=2)
    assert last_call("xformers.ops.fmha")["query.shape"] == (2, 40, 2, 2, 64)  # BMGHK
    assert last_call("xformers.ops.fmha")["key.shape"] == (2, 72, 2, 2, 64)
    check_call(plugin, kernels["transformer-engine"], heads_q=4, heads_kv=2)
    assert last_call("transformer_engine.pytorch")["init"]["num_gqa_groups"] == 2


@pytest.mark.parametrize("name", DENSE)
def test_head_dim_vo_differing_from_head_dim_qk(plugin, kernels, name):
    kernel = kernels[name]
    batch = 1 if name == "flashinfer-prefill" else 2
    if kernel.different_vo:
        check_call(plugin, kernel, batch=batch, head_dim=64, head_dim_vo=128)
    else:
        spec = make_call(plugin, kernel, batch=batch, head_dim=64, head_dim_vo=128)[0]
        assert kernel.decline_reason(spec) == "head_dim_vo 128 != head_dim_qk 64 is not supported"
    assert kernel.different_vo == (name in {"flash-attn-3", "flash-attn-4", "xformers", "flex-attention",
                                            "transformer-engine"})


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("name", DENSE)
def test_masks(plugin, kernels, name, kind):
    kernel = kernels[name]
    batch = 1 if name == "flashinfer-prefill" else 2
    mask = random_mask(kind, batch, 4, 40, 72)
    if kind in kernel.masks:
        check_call(plugin, kernel, batch=batch, mask=mask)
        # With the causal diagonal too, which the adapters fold into the mask where the library
        # takes one or the other.
        check_call(plugin, kernel, batch=batch, mask=mask, causal=kernel.causal_alignments[-1])
    else:
        spec = make_call(plugin, kernel, batch=batch, mask=mask)[0]
        assert kernel.decline_reason(spec) == f"{kind} masks are not supported"
    expected = {"xformers": ("bool", "float"), "flex-attention": ("bool", "float"),
                "sageattn-triton": ("bool", "float"), "flashinfer-prefill": ("bool",),
                "transformer-engine": ("bool",)}
    assert tuple(kernel.masks) == expected.get(name, ())


def test_mask_conversions_reach_the_libraries_in_their_conventions(plugin, kernels):
    mask = random_mask("bool", 2, 4, 40, 72)
    check_call(plugin, kernels["transformer-engine"], mask=mask, causal="bottom_right")
    te = last_call("transformer_engine.pytorch")
    assert te["init"]["attn_mask_type"] == "arbitrary" and te["attention_mask"].dtype == torch.bool
    assert te["attention_mask"][0, 0, 0, 0].item() is False  # TE: True = masked out
    check_call(plugin, kernels["xformers"], mask=random_mask("float", 2, 4, 40, 77), seq_kv=77)
    bias = last_call("xformers.ops.fmha")["attn_bias"]
    assert bias.shape == (2, 4, 40, 77) and bias.dtype == torch.float32 and bias.stride(2) % 8 == 0
    mask = random_mask("bool", 1, 4, 40, 72)
    check_call(plugin, kernels["flashinfer-prefill"], batch=1, mask=mask)
    flashinfer = last_call("flashinfer")
    assert flashinfer["packed_custom_mask"].dtype == torch.uint8 and flashinfer["custom_mask"] is None
    float_mask = random_mask("float", 2, 4, 40, 72)
    check_call(plugin, kernels["sageattn-triton"], mask=float_mask)
    sage = last_call("sageattention")
    assert sage["is_causal"] is False and sage["attn_mask"].dtype == torch.float16


def test_a_nan_in_the_inputs_is_not_taken_for_a_write(plugin, kernels):
    kernel = kernels["xformers"]
    spec, q, k, v, mask = make_call(plugin, kernel)
    q[0, 0, 0, 0] = float("nan")
    prepared = plugin._Prepared(kernel, spec, q, k, v, mask)
    prepared.run()
    assert prepared.problem() is None
    prepared.inputs.k[0, 0, 0, 0] += 1
    assert prepared.problem() == "the kernel wrote into its input 'k'"


@pytest.mark.parametrize("name", DENSE)
def test_dtypes_outside_the_library_are_declined(plugin, kernels, name):
    kernel = kernels[name]
    spec = make_call(plugin, kernel, batch=1, dtype="float64")[0]
    reason = kernel.decline_reason(spec)
    assert reason.startswith("dtype float64 is not supported (takes "), reason


def test_flash_attn_2_declines_head_dims_above_256(plugin, kernels):
    kernel = kernels["flash-attn-2"]
    spec = make_call(plugin, kernel, head_dim=320, seq_q=8, seq_kv=8)[0]
    assert kernel.decline_reason(spec) == "head_dim 320 is above 256, FlashAttention-2's largest"
    check_call(plugin, kernel, head_dim=40)  # padded to a multiple of 8 inside the call


def test_flash_attn_3_head_dim_rules(plugin, kernels):
    kernel, fp8 = kernels["flash-attn-3"], kernels["flash-attn-3-fp8"]
    assert "multiples of 8" in kernel.decline_reason(make_call(plugin, kernel, head_dim=60)[0])
    assert "multiples of 16" in fp8.decline_reason(make_call(plugin, fp8, head_dim=72)[0])
    reason = kernel.decline_reason(make_call(plugin, kernel, head_dim=128, head_dim_vo=64)[0])
    assert "(128, 192]" in reason and "head_dim_vo" in reason
    check_call(plugin, kernel, head_dim=192, head_dim_vo=128, seq_q=8, seq_kv=16)
    kernel.compute_capability = (8, 0)
    spec = dataclasses.replace(make_call(plugin, kernel, head_dim=64, head_dim_vo=128)[0], device="cuda")
    assert kernel.decline_reason(spec) == ("head_dim_vo != head_dim_qk is supported by FlashAttention-3 on Hopper "
                                           "(sm90) only")


def test_flash_attn_3_before_returning_the_output_alone(plugin, kernels, monkeypatch):
    monkeypatch.setattr(importlib.import_module("flash_attn_interface"), "RETURNS_LSE_ALWAYS", True)
    check_call(plugin, kernels["flash-attn-3"])
    check_call(plugin, kernels["flash-attn-3-fp8"])


@pytest.mark.parametrize("granularity", ["per_head", "per_tensor"])
def test_flash_attn_3_fp8_quantizes_in_prepare_with_kv_head_descales(plugin, kernels, granularity):
    kernel = kernels["flash-attn-3-fp8"]
    assert kernel.has_preparation() and kernel.reduced_precision == "float8_e4m3fn"
    spec = check_call(plugin, kernel, heads_q=4, heads_kv=2, causal="bottom_right", quant={"fp8_scale": granularity})
    call = last_call("flash_attn_interface")
    assert call["q.dtype"] == call["k.dtype"] == torch.float8_e4m3fn
    for name in ("q_descale", "k_descale", "v_descale"):
        descale = call[name]
        assert descale.shape == (spec.batch, spec.heads_kv) and descale.dtype == torch.float32
        assert (descale == descale.flatten()[0]).all() == (granularity == "per_tensor")


def test_flash_attn_4_head_dims_by_architecture(plugin, kernels):
    kernel = kernels["flash-attn-4"]
    spec = make_call(plugin, kernel, head_dim=192, head_dim_vo=128, seq_q=8, seq_kv=8)[0]
    assert kernel.decline_reason(spec) is None
    kernel.compute_capability = (10, 0)
    assert kernel.decline_reason(spec) is None  # DeepSeek's shape, taken on Blackwell
    spec = make_call(plugin, kernel, head_dim=160, seq_q=8, seq_kv=8)[0]
    assert "sm100" in kernel.decline_reason(spec)
    kernel.compute_capability = (9, 0)
    assert kernel.decline_reason(spec) is None


def test_flashinfer_declines_batches_and_masks_per_head(plugin, kernels):
    kernel = kernels["flashinfer-prefill"]
    reason = kernel.decline_reason(make_call(plugin, kernel, batch=2)[0])
    assert reason.startswith("batch 2 > 1: single_prefill_with_kv_cache takes one sequence"), reason
    mask = torch.ones(1, 4, 40, 72, dtype=torch.bool)
    reason = kernel.decline_reason(make_call(plugin, kernel, batch=1, mask=mask)[0])
    assert "differs between heads" in reason and "(1, 4, 40, 72)" in reason
    assert "head_dim 96 is not supported" in kernel.decline_reason(make_call(plugin, kernel, batch=1, head_dim=96)[0])


def test_transformer_engine_mask_types_and_output_shape(plugin, kernels):
    kernel = kernels["transformer-engine"]
    for causal, mask_type in ((None, "no_mask"), ("top_left", "causal"), ("bottom_right", "causal_bottom_right")):
        check_call(plugin, kernel, causal=causal)
        init = last_call("transformer_engine.pytorch")["init"]
        assert init["attn_mask_type"] == mask_type and init["qkv_format"] == "bshd"
        assert init["softmax_scale"] == SCALE and init["attention_type"] == "cross"
    check_call(plugin, kernel, head_dim=64, head_dim_vo=32)
    assert last_call("transformer_engine.pytorch")["init"]["kv_channels"] == (64, 32)


def test_flex_attention_builds_its_block_mask_in_prepare(plugin, kernels):
    kernel = kernels["flex-attention"]
    assert kernel.has_preparation()
    mask = random_mask("bool", 2, 4, 40, 72)
    spec, q, k, v, mask = make_call(plugin, kernel, mask=mask, causal="bottom_right", heads_kv=2)
    prepared = plugin._Prepared(kernel, spec, q, k, v, mask).prepared
    assert prepared.block_mask is not None and prepared.score_mod is None
    assert prepared.block_mask.shape[:2] == (2, 1)  # the mask varies over batch, not over heads
    assert prepared.k.shape[1] == 2  # GQA through enable_gqa, K as it is
    reason = kernel.decline_reason(dataclasses.replace(make_call(plugin, kernel, head_dim=8)[0], device="cuda"))
    assert "below 16" in reason


def test_flex_attention_compiles_once_per_kind_of_call(plugin, kernels):
    kernel = type(kernels["flex-attention"])()
    kernel.device = "cpu"
    assert kernel.compile and kernel._compiled == {}  # nothing compiled at registration
    spec, *_ = make_call(plugin, kernel)
    first = kernel._flex_attention(spec)
    # Another length is the same kind of call: dynamic shapes, one compilation.
    longer, *_ = make_call(plugin, kernel, seq_q=100, seq_kv=300)
    assert kernel._flex_attention(longer) is first
    # Causality (or a mask, a dtype, head dims, GQA) makes another kind.
    causal, *_ = make_call(plugin, kernel, causal="top_left")
    assert kernel._flex_attention(causal) is not first
    grouped, *_ = make_call(plugin, kernel, heads_kv=2)
    assert kernel._flex_attention(grouped) is not first
    assert len(kernel._compiled) == 3
    assert kernel.kind_text(grouped) == "float32 d64/64, no mask, GQA 4/2, batch 2, seq_q <128, seq_kv <128"
    # Compiling ahead is for the GPU's compiled kernel; on the CPU there is nothing to do ahead.
    assert kernel.precompile(spec) is None


@pytest.mark.parametrize("seq_q, seq_kv, causal, mask_dims", [
    (200, 200, None, (2, 1)), (40, 300, "bottom_right", (2, 4)), (300, 140, "top_left", (1, 1)),
    (256, 384, "bottom_right", None), (130, 257, "top_left", None), (1, 300, "bottom_right", (2, 1)),
    (128, 128, None, (1, 4))])
def test_flex_attention_block_mask_is_create_block_masks(plugin, kernels, seq_q, seq_kv, causal, mask_dims):
    """The block mask prepare() builds from the call's mask with tensor operations is the one
    create_block_mask builds by evaluating the mask_mod: the same full and partial blocks."""
    from torch.nn.attention.flex_attention import create_block_mask

    kernel = kernels["flex-attention"]
    mask = None
    if mask_dims is not None:
        generator = torch.Generator().manual_seed(seq_q + seq_kv)
        mask = torch.rand(*mask_dims, seq_q, seq_kv, generator=generator) > 0.4
        mask[..., : seq_kv // 3, :] &= torch.rand(*mask_dims, 1, seq_kv, generator=generator) > 0.5  # whole blocks go
        mask[..., 5:9] = True
    spec, q, k, v, mask = make_call(plugin, kernel, batch=2, heads_q=4, seq_q=seq_q, seq_kv=seq_kv, causal=causal,
                                    mask=mask)
    prepared = plugin._Prepared(kernel, spec, q, k, v, mask).prepared
    offset = (seq_kv - seq_q if causal == "bottom_right" else 0) if causal else None
    # create_block_mask's batch and head dims: only where the mask varies over them.
    dims = (2 if mask_dims and mask_dims[0] > 1 else None, 4 if mask_dims and mask_dims[1] > 1 else None)

    def mask_mod(b, h, q_idx, kv_idx):
        keep = mask[b % mask.shape[0], h % mask.shape[1], q_idx, kv_idx] if mask is not None else q_idx >= 0
        return keep & (kv_idx <= q_idx + offset) if offset is not None else keep

    want = create_block_mask(mask_mod, dims[0], dims[1], seq_q, seq_kv, device="cpu")
    got = prepared.block_mask
    assert got.seq_lengths == (seq_q, seq_kv)

    def listed(counts, indices):
        """(..., key blocks) 1 where a BlockMask lists the block (indices are a permutation)."""
        first = (torch.arange(indices.shape[-1]) < counts[..., None]).int()
        return torch.zeros(indices.shape, dtype=torch.int32).scatter_(-1, indices.long(), first)

    for counts, indices in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices")):
        g = listed(getattr(got, counts), getattr(got, indices))
        w = listed(getattr(want, counts), getattr(want, indices))
        assert torch.equal(g.expand_as(w), w), counts


def test_adapters_are_read_without_importing_them_as_their_classes_say(plugin, kernels):
    """attnreplay_adapters.py reads each adapter's kernels from its source: the same names and
    capabilities as the imported objects, and with the stand-ins on the path, every library found
    installed, without importing any."""
    import attnreplay_adapters

    described, problems = attnreplay_adapters.describe_adapters(str(ADAPTERS))
    assert problems == []
    assert sorted(d["name"] for d in described) == ALL
    for d in described:
        kernel = type(kernels[d["name"]])  # the class: the fixture set instances' device to cpu
        for field in ("summary", "device", "layout", "headline", "reduced_precision", "extensions"):
            assert d[field] == getattr(kernel, field), (d["name"], field)
        assert d["missing"] == [], d
        assert d["file"].endswith(kernel.__module__.replace("attnreplay_plugin_", "") + ".py")
    assert attnreplay_adapters.module_present("flash_attn.cute.interface")  # a stand-in's submodule
    assert not attnreplay_adapters.module_present("flash_attn.nowhere")
    assert not attnreplay_adapters.module_present("not_a_library_here")


def test_sageattn_triton_maps_granularity_and_smoothing(plugin, kernels):
    kernel = kernels["sageattn-triton"]
    # Per block whatever --quant_gran says: the run's default (per_warp) does not keep it out.
    assert kernel.decline_reason(make_call(plugin, kernel, quant={"quant_gran": "per_warp"})[0]) is None
    assert "per block" in kernel.summary
    assert kernel.reduced_precision == "int8"
    check_call(plugin, kernel, quant={"k_smooth": False})
    assert last_call("sageattention")["smooth_k"] is False
    check_call(plugin, kernel, head_dim=80)  # padded to 128 inside the call
    assert "above 128" in kernel.decline_reason(make_call(plugin, kernel, head_dim=192)[0])


def test_sageattn_triton_on_sageattention_1_0(plugin, kernels, monkeypatch):
    """1.0.x's sageattn subtracts K's mean from the caller's K: the adapter smooths a copy itself."""
    sageattention = importlib.import_module("sageattention")
    monkeypatch.delattr(sageattention, "sageattn_qk_int8_pv_fp16_triton")
    monkeypatch.setattr(sageattention, "sageattn", sageattention.sageattn_1_0_6)
    kernel = type(kernels["sageattn-triton"])()
    kernel.device = "cpu"
    assert kernel.masks == () and tuple(kernel.head_dims) == (64, 96, 128) and "float32" in kernel.dtypes
    check_call(plugin, kernel, causal="top_left", heads_kv=2)  # problem() checks that K was not written
    assert last_call("sageattention")["function"] == "sageattn (1.0.6)"
    assert last_call("sageattention")["smooth_k"] is False
    check_call(plugin, kernel, dtype="float32")
    assert kernel.decline_reason(make_call(plugin, kernel, head_dim=80)[0]).startswith("head_dim 80 is not supported")


@pytest.mark.parametrize("granularity", ["per_warp", "per_thread"])
def test_sage2_cuda_sm90_runs_the_raw_kernel_on_its_own_quantization(plugin, kernels, granularity):
    kernel = kernels["sage2-cuda"]
    assert kernel.has_preparation() and kernel.reduced_precision == "int8"
    check_call(plugin, kernel, heads_q=4, heads_kv=2, causal="top_left", seq_kv=200, quant={"quant_gran": granularity})
    raw = last_call("sageattention._qattn_sm90")
    assert raw["kernel"] == "_qattn_sm90.qk_int8_sv_f8_accum_f32_fuse_v_scale_attn_inst_buf"
    assert raw["qk_quant_gran"] == (2 if granularity == "per_warp" else 3) and raw["is_causal"] == 1
    assert raw["value.shape"] == (2, 2, 64, 256)  # 200 keys padded to a multiple of 128, transposed
    quantized = (last_call("sageattention.quant")["per_warp_int8"] if granularity == "per_warp"
                 else last_call("sageattention.triton.quant_per_thread"))
    assert (quantized["BLKQ"], quantized["WARPQ"], quantized["BLKK"]) == (64, 16, 128)
    assert quantized["km"] is not None


@pytest.mark.parametrize("accumulation", ["fp32", "fp32+fp32", "fp32+fp16"])
def test_sage2_cuda_sm89_accumulations(plugin, kernels, accumulation):
    kernel = kernels["sage2-cuda"]
    kernel.compute_capability = (8, 9)
    check_call(plugin, kernel, quant={"pv_accum_dtype": accumulation, "k_smooth": False}, head_dim=96)
    raw = last_call("sageattention._qattn_sm89")
    names = {"fp32": "qk_int8_sv_f8_accum_f32_fuse_v_scale_attn",
             "fp32+fp32": "qk_int8_sv_f8_accum_f32_fuse_v_scale_attn_inst_buf",
             "fp32+fp16": "qk_int8_sv_f8_accum_f16_fuse_v_scale_attn_inst_buf"}
    assert raw["kernel"] == "_qattn_sm89." + names[accumulation]
    assert raw["query.shape"] == (2, 4, 40, 128)  # head dim 96 padded to 128, as SageAttention pads it
    assert last_call("sageattention.quant")["per_warp_int8"]["km"] is None
    assert last_call("sageattention.quant")["per_channel_fp8"].get("scale_max") == (
        2.25 if accumulation == "fp32+fp16" else 448.0)


def test_sage2_cuda_declines(plugin, kernels):
    kernel = kernels["sage2-cuda"]
    reason = kernel.decline_reason(make_call(plugin, kernel, quant={"quant_gran": "per_block"})[0])
    assert reason.startswith("--quant_gran per_block is not supported")
    reason = kernel.decline_reason(make_call(plugin, kernel, quant={"pv_accum_dtype": "fp32+fp16"})[0])
    assert reason == "--pv_accum_dtype fp32+fp16 is not supported by SageAttention2's sm90 kernels (takes fp32+fp32)"
    assert "above 128" in kernel.decline_reason(make_call(plugin, kernel, head_dim=256)[0])
    kernel.compute_capability = (8, 0)
    reason = kernel.decline_reason(make_call(plugin, kernel)[0])
    assert reason == "SageAttention2's FP8 kernels are built for sm89, sm90 and sm120, not sm80"


def test_adapters_report_unavailable_with_the_import_error():
    """Without the libraries (imports blocked, whatever is installed), every adapter loads, registers
    nothing, and lists each of its kernels with the import error."""
    blocked = ["sageattention", "xformers", "flash_attn", "flash_attn_interface", "flashinfer", "transformer_engine",
               "torch.nn.attention.flex_attention"]
    script = f"""
import importlib.abc, json, sys
import torch
BLOCKED = {blocked!r}
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ModuleNotFoundError(f"No module named {{name!r}}")
        return None
sys.meta_path.insert(0, Absent())
for name in [m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in BLOCKED)]:
    del sys.modules[name]
sys.path.insert(0, {str(PLUGIN_API)!r})
import attnreplay_plugin as ar
failures = ar._load_adapters({str(ADAPTERS)!r})
print(json.dumps({{"failures": failures, "registered": [k.name for k, _ in ar._entries()],
                  "unavailable": dict(ar._unavailable_kernels())}}))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["failures"] == [] and report["registered"] == []
    assert sorted(report["unavailable"]) == ALL
    for name, reason in report["unavailable"].items():
        assert " does not import: ModuleNotFoundError: No module named " in reason, (name, reason)
    assert report["unavailable"]["flex-attention"].startswith("torch.nn.attention.flex_attention does not import")
    assert report["unavailable"]["sage2-cuda"].startswith("sageattention does not import")


# -- Ragged and paged batches (layout "thd": flash-attn-4-varlen, flashinfer-decode, flashinfer-batch-prefill) --

RAGGED_DTYPE = {"flash-attn-4-varlen": "bfloat16", "flashinfer-decode": "bfloat16",
                "flashinfer-batch-prefill": "float16"}
RAGGED_TOLERANCE = {"bfloat16": 1e-2, "float16": 2e-3}


@dataclasses.dataclass
class RaggedCall:
    spec: object
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    batch: dict  # cu_seqlens_q, cu_seqlens_k, seqused_k, block_table: what a thd kernel receives


def make_ragged_call(plugin, kernel, q_lens, k_lens, *, page_size=0, capacities=None, heads_q=8, heads_kv=2,
                     head_dim=64, head_dim_vo=None, causal=None, dtype=None, seed=0, window_left=None,
                     window_right=None, softcap=0.0, sinks=None):
    """A ragged call as attnreplay hands it to a thd kernel: q packed (total_q, heads_q, d); keys packed
    (segments of `capacities` rows, default k_lens, with seqused_k where a sequence uses fewer), or with
    page_size, a cache of shuffled pages (two more than the sequences use) read through a block table
    padded with -1, and seqused_k."""
    dtype = getattr(torch, dtype or RAGGED_DTYPE[kernel.name.removesuffix("-on-cpu")])
    head_dim_vo = head_dim_vo or head_dim
    generator = torch.Generator().manual_seed(seed)

    def rows(count, heads, dim):
        return torch.randn(count, heads, dim, generator=generator).to(dtype)

    def offsets(lengths):
        return torch.tensor([0] + list(lengths)).cumsum(0).to(torch.int32)

    q = rows(sum(q_lens), heads_q, head_dim)
    batch = dict(cu_seqlens_q=offsets(q_lens), cu_seqlens_k=None, seqused_k=None, block_table=None)
    if page_size:
        counts = [-(-n // page_size) for n in k_lens]
        pages = sum(counts) + 2
        order = torch.randperm(pages, generator=generator).tolist()
        table = torch.full((len(k_lens), max(counts)), -1, dtype=torch.int32)
        for b, count in enumerate(counts):
            table[b, :count] = torch.tensor([order.pop() for _ in range(count)], dtype=torch.int32)
        k = rows(pages * page_size, heads_kv, head_dim).view(pages, page_size, heads_kv, head_dim)
        v = rows(pages * page_size, heads_kv, head_dim_vo).view(pages, page_size, heads_kv, head_dim_vo)
        batch.update(block_table=table, seqused_k=torch.tensor(k_lens, dtype=torch.int32))
        seq_kv = pages * page_size
    else:
        capacities = capacities or k_lens
        k, v = rows(sum(capacities), heads_kv, head_dim), rows(sum(capacities), heads_kv, head_dim_vo)
        batch["cu_seqlens_k"] = offsets(capacities)
        if list(capacities) != list(k_lens):
            batch["seqused_k"] = torch.tensor(k_lens, dtype=torch.int32)
        seq_kv = sum(capacities)
    fields = dict(index=0, op="test", dtype=str(dtype).removeprefix("torch."), model_layout="thd", batch=1,
                  heads_q=heads_q, heads_kv=heads_kv, seq_q=sum(q_lens), seq_kv=seq_kv, head_dim_qk=head_dim,
                  head_dim_vo=head_dim_vo, is_causal=causal is not None, causal_alignment=causal or "bottom_right",
                  scale=SCALE, mask_kind=None, mask_shape=None, metadata={}, quant=QUANT_DEFAULTS,
                  q_lens=tuple(q_lens), k_lens=tuple(k_lens), page_size=page_size, window_left=window_left,
                  window_right=window_right, softcap=softcap,
                  sinks_shape=None if sinks is None else tuple(sinks.shape))
    if sinks is not None:
        batch["sinks"] = sinks
    return RaggedCall(plugin._make_spec(kernel, fields), q, k, v, batch)


def ragged_reference(call):
    """(output, seen) in fp64: each sequence's queries over its own keys (its packed segment's first
    seqused_k rows, or its pages through the block table), K and V repeated for GQA, causal bottom-right
    within the sequence; `seen` marks the rows that see a key (the others have no defined output)."""
    spec, batch = call.spec, call.batch
    cu_q = batch["cu_seqlens_q"].tolist()
    out = torch.zeros(call.q.shape[0], spec.heads_q, spec.head_dim_vo, dtype=torch.float64)
    seen = torch.zeros(call.q.shape[0], dtype=torch.bool)
    for b, (q_len, k_len) in enumerate(zip(spec.q_lens, spec.k_lens)):
        if batch["block_table"] is not None:
            pages = batch["block_table"][b, :-(-k_len // spec.page_size)].long()
            keys, values = (t[pages].reshape(-1, *t.shape[2:])[:k_len] for t in (call.k, call.v))
        else:
            first = int(batch["cu_seqlens_k"][b])
            keys, values = call.k[first:first + k_len], call.v[first:first + k_len]
        group = spec.heads_q // spec.heads_kv
        keys, values = (t.to(torch.float64).repeat_interleave(group, dim=1).transpose(0, 1) for t in (keys, values))
        queries = call.q[cu_q[b]:cu_q[b + 1]].to(torch.float64).transpose(0, 1)
        scores = queries @ keys.transpose(-1, -2) * spec.scale
        if spec.softcap > 0:
            scores = spec.softcap * torch.tanh(scores / spec.softcap)
        diagonal = torch.arange(q_len)[:, None] + (k_len - q_len)
        columns = torch.arange(k_len)[None, :]
        visible = torch.ones(q_len, k_len, dtype=torch.bool)
        if spec.is_causal:
            visible &= columns <= diagonal
        if spec.window_left is not None:
            visible &= columns >= diagonal - spec.window_left
        if spec.window_right is not None:
            visible &= columns <= diagonal + spec.window_right
        row_seen = visible.any(dim=1)
        scores = scores.masked_fill(~visible, float("-inf"))
        if batch.get("sinks") is not None:  # one more logit a head, in the denominator only
            sink = batch["sinks"].to(torch.float64).view(-1, 1, 1).expand(spec.heads_q, q_len, 1)
            scores = torch.cat([scores, sink], dim=-1)
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)[..., :k_len]
        out[cu_q[b]:cu_q[b + 1]] = (weights @ values).transpose(0, 1)
        seen[cu_q[b]:cu_q[b + 1]] = row_seen
    return out, seen


def run_ragged(plugin, kernel, call):
    """The kernel's output for `call` through the plug-in host's own path (its checks of the output's
    shape, dtype and device, and of writes into the inputs)."""
    assert kernel.decline_reason(call.spec) is None, kernel.decline_reason(call.spec)
    prepared = plugin._Prepared(kernel, call.spec, call.q, call.k, call.v, None, call.batch)
    prepared.run()
    assert prepared.problem() is None, prepared.problem()
    return prepared.out


def check_ragged(plugin, kernel, call):
    out = run_ragged(plugin, kernel, call)
    want, seen = ragged_reference(call)
    assert seen.any()
    got = out.to(torch.float64)[seen]
    assert torch.isfinite(got).all()
    error = (got - want[seen]).norm() / want[seen].norm()
    assert error < RAGGED_TOLERANCE[call.spec.dtype], f"{kernel.name}: relative L2 error {error:.3g}"
    return out


def flashinfer_plan():
    return importlib.import_module("flashinfer._batch").LAST_PLAN


def test_ragged_adapters_take_thd_batches_and_read_pages(kernels):
    for name in RAGGED:
        kernel = kernels[name]
        assert kernel.layout == "thd" and kernel.paged and kernel.native_gqa, name
        assert kernel.causal_alignments == ("bottom_right",) and kernel.masks == (), name
    # The wrappers' run() is what an engine calls per layer; plan() is its set-up once a step.
    assert kernels["flashinfer-decode"].headline == kernels["flashinfer-batch-prefill"].headline == "run"
    assert not kernels["flash-attn-4-varlen"].has_preparation()


# Sequences of different lengths: with pages of 16, 16 and 48 keys fill their last page, 33 leaves one
# key in it, 5 is one partial page.
DECODE_K_LENS = [16, 33, 5, 48]


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", ["flashinfer-decode", "flash-attn-4-varlen"])
def test_paged_decode_with_gqa(plugin, kernels, name, page_size):
    kernel = kernels[name]
    for causal in (None, "bottom_right"):  # one query row: bottom-right causality hides nothing
        call = make_ragged_call(plugin, kernel, [1] * 4, DECODE_K_LENS, page_size=page_size, heads_q=8, heads_kv=2,
                                causal=causal)
        check_ragged(plugin, kernel, call)
    if name == "flashinfer-decode":
        plan = flashinfer_plan()
        assert plan["wrapper"] == "BatchDecodeWithPagedKVCacheWrapper" and plan["page_size"] == page_size
        full = [page_size if page_size == 1 else n for n in (16, 1, 5, 16)]
        assert plan["last_page_len"].tolist() == full
        pages = torch.tensor([-(-n // page_size) for n in DECODE_K_LENS])
        assert plan["indptr"].tolist() == [0, *pages.cumsum(0).tolist()]
        assert plan["q_data_type"] == plan["kv_data_type"] == torch.bfloat16 and plan["sm_scale"] == SCALE
        assert (plan["window_left"], plan["logits_soft_cap"], plan["pos_encoding_mode"]) == (-1, 0.0, "NONE")
        assert plan["use_tensor_cores"] is False  # 4 query heads a KV head: the CUDA-core kernel
    else:
        varlen = last_call("flash_attn.cute.interface")
        assert varlen["page_table"] is not None and varlen["cu_seqlens_k"] is None
        assert (varlen["max_seqlen_q"], varlen["max_seqlen_k"]) == (1, 48) and varlen["softmax_scale"] == SCALE
        assert varlen["k.shape"][1:] == (page_size, 2, 64)  # the pages as they are, 2 KV heads


@pytest.mark.parametrize("heads_q, tensor_cores", [(2, False), (8, False), (10, True), (16, True)])
def test_flashinfer_decode_takes_tensor_cores_above_4_query_heads_a_kv_head(plugin, kernels, heads_q, tensor_cores):
    # The stand-in's CUDA-core path, as FlashInfer's, has no kernel for 5 query heads a KV head.
    kernel = kernels["flashinfer-decode"]
    check_ragged(plugin, kernel, make_ragged_call(plugin, kernel, [1, 1], [20, 7], page_size=16, heads_q=heads_q,
                                                  heads_kv=2))
    assert flashinfer_plan()["use_tensor_cores"] is tensor_cores


def test_flashinfer_decode_reads_packed_keys_as_pages_of_one_row(plugin, kernels):
    kernel = kernels["flashinfer-decode"]
    # The second sequence uses 6 of its 9 keys (seqused_k).
    call = make_ragged_call(plugin, kernel, [1, 1, 1], [12, 6, 30], capacities=[12, 9, 30])
    check_ragged(plugin, kernel, call)
    plan = flashinfer_plan()
    assert plan["page_size"] == 1 and plan["last_page_len"].tolist() == [1, 1, 1]
    assert plan["indices"].tolist() == list(range(12)) + list(range(12, 18)) + list(range(21, 51))


@pytest.mark.parametrize("causal", [None, "bottom_right"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", ["flashinfer-batch-prefill", "flash-attn-4-varlen"])
def test_paged_prefill(plugin, kernels, name, page_size, causal):
    # Queries fewer than keys in most sequences (a prefill over a cached prefix), as many in one.
    kernel = kernels[name]
    call = make_ragged_call(plugin, kernel, [5, 17, 1, 32], [40, 17, 9, 64], page_size=page_size, causal=causal)
    check_ragged(plugin, kernel, call)
    if name == "flashinfer-batch-prefill":
        plan = flashinfer_plan()
        assert plan["wrapper"] == "BatchPrefillWithPagedKVCacheWrapper" and plan["causal"] is (causal is not None)
        assert plan["qo_indptr"].tolist() == [0, 5, 22, 23, 55] and plan["q_data_type"] == torch.float16
    else:
        assert last_call("flash_attn.cute.interface")["causal"] is (causal is not None)


@pytest.mark.parametrize("causal", [None, "bottom_right"])
@pytest.mark.parametrize("name", ["flashinfer-batch-prefill", "flash-attn-4-varlen"])
def test_packed_ragged_prefill(plugin, kernels, name, causal):
    kernel = kernels[name]
    call = make_ragged_call(plugin, kernel, [7, 1, 20, 3], [7, 30, 25, 3], causal=causal, heads_q=6, heads_kv=3)
    check_ragged(plugin, kernel, call)
    if name == "flashinfer-batch-prefill":
        plan = flashinfer_plan()
        assert plan["wrapper"] == "BatchPrefillWithRaggedKVCacheWrapper"
        assert plan["kv_indptr"].tolist() == [0, 7, 37, 62, 65] and plan["causal"] is (causal is not None)
    else:
        varlen = last_call("flash_attn.cute.interface")
        assert varlen["seqused_k"] is None and varlen["page_table"] is None
        assert (varlen["max_seqlen_q"], varlen["max_seqlen_k"]) == (20, 30)


@pytest.mark.parametrize("name", ["flashinfer-batch-prefill", "flash-attn-4-varlen"])
def test_packed_prefill_whose_seqused_k_leaves_keys_unused(plugin, kernels, name):
    kernel = kernels[name]
    call = make_ragged_call(plugin, kernel, [4, 6], [10, 3], capacities=[16, 8], causal="bottom_right")
    check_ragged(plugin, kernel, call)
    if name == "flashinfer-batch-prefill":
        # kv_indptr cannot skip rows: the paged wrapper, over the packed rows as pages of one row.
        plan = flashinfer_plan()
        assert plan["wrapper"] == "BatchPrefillWithPagedKVCacheWrapper" and plan["page_size"] == 1
        assert plan["paged_kv_indices"].tolist() == list(range(10)) + [16, 17, 18]
    else:
        assert last_call("flash_attn.cute.interface")["seqused_k"].tolist() == [10, 3]


def test_flash_attn_4_varlen_different_head_dim_vo(plugin, kernels):
    kernel = kernels["flash-attn-4-varlen"]
    check_ragged(plugin, kernel, make_ragged_call(plugin, kernel, [3, 9], [11, 9], page_size=16, head_dim=192,
                                                  head_dim_vo=128, causal="bottom_right"))


def test_flashinfer_ragged_prefill_takes_a_sequence_without_keys(plugin, kernels):
    # The ragged wrapper's planner takes an empty key segment (its rows see nothing and are not judged).
    kernel = kernels["flashinfer-batch-prefill"]
    check_ragged(plugin, kernel, make_ragged_call(plugin, kernel, [3, 4, 2], [8, 0, 5]))


def ragged_decline(plugin, kernel, *args, **kwargs):
    return kernel.decline_reason(make_ragged_call(plugin, kernel, *args, **kwargs).spec)


def test_flashinfer_decode_declines_more_than_one_query_row_and_sequences_without_keys(plugin, kernels):
    kernel = kernels["flashinfer-decode"]
    reason = ragged_decline(plugin, kernel, [1, 3, 1, 2], [10, 10, 10, 10], page_size=16)
    assert reason == ("sequence 1 has 3 query rows (2 of 4 sequences have other than 1): "
                      "BatchDecodeWithPagedKVCacheWrapper decodes one query row a sequence "
                      "(flashinfer-batch-prefill takes the others)"), reason
    reason = ragged_decline(plugin, kernel, [1, 1], [10, 0], page_size=16)
    assert reason == ("sequence 1 has no keys: FlashInfer's page table gives every sequence "
                      "1 <= last_page_len <= page_size keys in its last page"), reason
    # Packed keys are read as pages too: the same rule.
    assert ragged_decline(plugin, kernel, [1, 1], [0, 4]).startswith("sequence 0 has no keys")


def test_flashinfer_batch_prefill_declines_sequences_without_keys_where_it_reads_pages(plugin, kernels):
    kernel = kernels["flashinfer-batch-prefill"]
    assert ragged_decline(plugin, kernel, [2, 2], [0, 9], page_size=4).startswith("sequence 0 has no keys")
    assert ragged_decline(plugin, kernel, [2, 2], [0, 9], capacities=[3, 9]).startswith("sequence 0 has no keys")
    assert ragged_decline(plugin, kernel, [2, 2], [0, 9]) is None  # the ragged wrapper


@pytest.mark.parametrize("name", RAGGED)
def test_ragged_adapters_decline_dense_calls_dtypes_head_dims_and_top_left_causality(plugin, kernels, name):
    kernel = kernels[name]
    dense = dataclasses.replace(make_ragged_call(plugin, kernel, [1], [8]).spec, model_layout="bhsd")
    assert kernel.decline_reason(dense) == "takes ragged (thd) batches only"
    reason = ragged_decline(plugin, kernel, [1, 1], [8, 8], page_size=4, dtype="float32")
    assert reason.startswith("dtype float32 is not supported (takes float16, bfloat16"), reason
    # Top-left causality differs from bottom-right in a sequence with fewer queries than keys.
    reason = ragged_decline(plugin, kernel, [1, 1], [8, 1], page_size=4, causal="top_left")
    assert "top_left" in reason and "computes bottom_right" in reason, reason
    assert ragged_decline(plugin, kernel, [1, 1], [1, 1], page_size=4, causal="top_left") is None
    if name.startswith("flashinfer"):
        reason = ragged_decline(plugin, kernel, [1], [8], page_size=4, head_dim=96)
        assert reason == "head_dim 96 is not supported (takes 64, 128, 256)", reason
        reason = ragged_decline(plugin, kernel, [1], [8], page_size=4, head_dim=64, head_dim_vo=128)
        assert reason == "head_dim_vo 128 != head_dim_qk 64 is not supported", reason
    else:
        reason = ragged_decline(plugin, kernel, [1], [8], page_size=4, head_dim=60)
        assert reason == "head dims (60, 60) must be multiples of 8 for FlashAttention-4", reason


def test_flash_attn_4_varlen_declines_by_architecture(plugin, kernels):
    kernel = kernels["flash-attn-4-varlen"]
    for major in (8, 12):
        kernel.compute_capability = (major, 0)
        assert ragged_decline(plugin, kernel, [2], [9], page_size=4) == \
            f"FlashAttention-4 has no paged KV kernel on sm{major}x"
        assert ragged_decline(plugin, kernel, [2], [9]) is None  # packed keys
    kernel.compute_capability = (10, 0)
    big = dict(head_dim=256, head_dim_vo=256)
    reason = ragged_decline(plugin, kernel, [2], [9], page_size=4, **big)
    assert "takes no seqused_k, which a paged batch needs" in reason, reason
    assert "packed batch using part of its keys" in ragged_decline(plugin, kernel, [2], [9], capacities=[12], **big)
    assert ragged_decline(plugin, kernel, [2], [9], **big) is None
    assert ragged_decline(plugin, kernel, [2], [9], page_size=4) is None


def test_the_stand_ins_reject_what_the_libraries_do(plugin):
    """The checks that make these tests able to fail: FlashInfer's run() refuses q of another dtype than
    plan()'s q_data_type (float16 unless told), its page lists' documented preconditions hold, FA4's
    varlen function takes no cu_seqlens_k beside a page table and int32 offsets only."""
    flashinfer = importlib.import_module("flashinfer")
    interface = importlib.import_module("flash_attn.cute.interface")
    workspace = torch.zeros(16, dtype=torch.uint8)
    pages = torch.randn(3, 4, 1, 64).to(torch.bfloat16)
    decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace)
    lists = (torch.tensor([0, 2], dtype=torch.int32), torch.tensor([2, 0], dtype=torch.int32))
    decode.plan(*lists, torch.tensor([4], dtype=torch.int32), 1, 1, 64, 4)
    with pytest.raises(ValueError, match="does not match the q_data_type torch.float16"):
        decode.run(torch.randn(1, 1, 64).to(torch.bfloat16), (pages, pages))
    with pytest.raises(ValueError, match="last_page_len .* within"):
        decode.plan(*lists, torch.tensor([0], dtype=torch.int32), 1, 1, 64, 4)
    decode.plan(*lists, torch.tensor([4], dtype=torch.int32), 5, 1, 64, 4, q_data_type=torch.bfloat16)
    with pytest.raises(RuntimeError, match="Unsupported group_size: 5"):
        decode.run(torch.randn(1, 5, 64).to(torch.bfloat16), (pages, pages))
    q = torch.randn(3, 1, 64).to(torch.bfloat16)
    offsets = torch.tensor([0, 3], dtype=torch.int32)
    with pytest.raises(AssertionError, match="page_table is not supported with cu_seqlens_k"):
        interface.flash_attn_varlen_func(q, pages, pages, cu_seqlens_q=offsets, cu_seqlens_k=offsets,
                                         page_table=torch.tensor([[0]], dtype=torch.int32))
    with pytest.raises(AssertionError, match="cu_seqlens_k must be int32"):
        interface.flash_attn_varlen_func(q, q, q, cu_seqlens_q=offsets, cu_seqlens_k=offsets.long())
    # Bottom-right within each sequence: 2 queries over 5 keys, the first sees keys 0..3.
    k = torch.randn(5, 1, 64).to(torch.bfloat16)
    out, _ = interface.flash_attn_varlen_func(q[:2], k, k, cu_seqlens_q=torch.tensor([0, 2], dtype=torch.int32),
                                              cu_seqlens_k=torch.tensor([0, 5], dtype=torch.int32), causal=True)
    scores = (q[0, 0].double() @ k[:4, 0].double().T) * 64 ** -0.5
    assert torch.allclose(out[0, 0].double(), torch.softmax(scores, -1) @ k[:4, 0].double(), atol=1e-2)


# -- Windows, softcaps, ALiBi and sinks (docs/format.md): honoured where the library computes them, or --
# -- declined by name --------------------------------------------------------------------------------

def make_extended_call(plugin, kernel, *, window_left=None, window_right=None, softcap=0.0, alibi=None, sinks=None,
                       alignment="bottom_right", **call):
    """(spec, q, k, v, mask, tensors): make_call's call with the extensions given, aligned as
    `alignment` says whether or not it is causal (capture writes bottom_right for flash-attn's ops),
    and the ALiBi slopes and sinks as attnreplay hands them over."""
    spec, q, k, v, mask = make_call(plugin, kernel, **call)
    spec = dataclasses.replace(spec, causal_alignment=alignment, window_left=window_left, window_right=window_right,
                               softcap=softcap, alibi_shape=None if alibi is None else tuple(alibi.shape),
                               sinks_shape=None if sinks is None else tuple(sinks.shape))
    return spec, q, k, v, mask, dict(alibi_slopes=alibi, sinks=sinks)


def extended_reference(spec, q, k, v, mask, tensors):
    """The record's semantics in fp64, step by step as docs/format.md orders them: scores · scale;
    softcap; + mask; − ALiBi · distance; keys outside causality and the window removed; softmax with
    the sink in its denominator; · v. A row that sees no key gives 0."""
    group = spec.heads_q // spec.heads_kv
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) * spec.scale
    if spec.softcap > 0:
        scores = spec.softcap * torch.tanh(scores / spec.softcap)
    offset = spec.seq_kv - spec.seq_q if spec.causal_alignment == "bottom_right" else 0
    diagonal = torch.arange(spec.seq_q)[:, None] + offset
    columns = torch.arange(spec.seq_kv)[None, :]
    allowed = torch.ones(spec.seq_q, spec.seq_kv, dtype=torch.bool)
    if mask is not None:
        if mask.dtype == torch.bool:
            allowed = allowed & mask
        else:
            scores = scores + mask.to(torch.float64)
    if tensors["alibi_slopes"] is not None:
        slopes = tensors["alibi_slopes"].to(torch.float64)
        slopes = slopes.view(-1, spec.heads_q, 1, 1)  # (heads) or (batch, heads)
        scores = scores - slopes * (diagonal - columns).abs()
    if spec.is_causal:
        allowed = allowed & (columns <= diagonal)
    if spec.window_left is not None:
        allowed = allowed & (columns >= diagonal - spec.window_left)
    if spec.window_right is not None:
        allowed = allowed & (columns <= diagonal + spec.window_right)
    scores = scores.masked_fill(~allowed, float("-inf"))
    if tensors["sinks"] is not None:
        sink = tensors["sinks"].to(torch.float64).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, sink], dim=-1)
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)[..., :spec.seq_kv]
    return weights @ v


def check_extended_call(plugin, kernel, **call):
    spec, q, k, v, mask, tensors = make_extended_call(plugin, kernel, **call)
    assert kernel.decline_reason(spec) is None, kernel.decline_reason(spec)
    prepared = plugin._Prepared(kernel, spec, q, k, v, mask, tensors)
    prepared.run()
    assert prepared.problem() is None, prepared.problem()
    out = prepared.output_bhsd()
    want = extended_reference(spec, q, k, v, mask, tensors)
    assert torch.isfinite(out.to(torch.float64)).all()
    error = (out.to(torch.float64) - want).norm() / want.norm()
    assert error < CASES[kernel.name]["tolerance"], f"{kernel.name}: relative L2 error {error:.3g}"
    return spec, q, k, v, mask, tensors


def extended_decline(plugin, kernel, **call):
    reason = kernel.decline_reason(make_extended_call(plugin, kernel, **call)[0])
    assert reason, f"{kernel.name} took {call}"
    return reason


def dense_batch(name):
    return 1 if name == "flashinfer-prefill" else 2


# (left, right, causal, seq_q, seq_kv), bottom-right as flash-attn's ops record them.
WINDOWS = {
    "left": (16, None, False, 40, 72),
    "right": (None, 8, False, 40, 72),
    "both": (16, 8, False, 40, 72),
    "left-causal": (16, None, True, 40, 72),
    "both-causal-more-queries": (16, 4, True, 72, 40),
    "left-more-queries": (8, None, False, 72, 40),
    "both-more-queries": (8, 50, False, 72, 40),
    "both-equal-lengths": (10, 3, False, 48, 48),
}
# The forms a library reads otherwise, and the words its adapter declines them with.
WINDOW_DECLINES = {
    ("flash-attn-2", "left-more-queries"): "FlashAttention-2 takes its right side as 40",
    ("flash-attn-2", "both-more-queries"): "FlashAttention-2 takes its right side as 40",
    ("flashinfer-prefill", "right"): "FlashInfer takes a left window only",
    ("flashinfer-prefill", "both"): "FlashInfer takes a left window only",
    ("flashinfer-prefill", "both-more-queries"): "FlashInfer takes a left window only",
    ("flashinfer-prefill", "both-equal-lengths"): "FlashInfer takes a left window only",
}
WINDOW_ARGUMENT = {"flash-attn-2": ("flash_attn", "window_size"), "flash-attn-3": ("flash_attn_interface", "window_size"),
                   "flash-attn-3-fp8": ("flash_attn_interface", "window_size"),
                   "flash-attn-4": ("flash_attn.cute.interface", "window_size"),
                   "flashinfer-prefill": ("flashinfer", "window_left")}


@pytest.mark.parametrize("case", sorted(WINDOWS))
@pytest.mark.parametrize("name", DENSE)
def test_sliding_windows(plugin, kernels, name, case):
    kernel = kernels[name]
    left, right, causal, seq_q, seq_kv = WINDOWS[case]
    call = dict(batch=dense_batch(name), window_left=left, window_right=right, seq_q=seq_q, seq_kv=seq_kv,
                causal="bottom_right" if causal else None)
    if "window" not in kernel.extensions:
        sides = ", ".join(f"{side} {value}" for side, value in (("left", left), ("right", right)) if value is not None)
        assert extended_decline(plugin, kernel, **call) == (f"the call has a sliding window ({sides}), which this "
                                                            f"kernel does not compute")
        return
    declined = WINDOW_DECLINES.get((name, case))
    if declined:
        assert declined in extended_decline(plugin, kernel, **call)
        return
    check_extended_call(plugin, kernel, **call)
    module, key = WINDOW_ARGUMENT[name]
    unbounded = None if name == "flash-attn-4" else -1
    wanted = ((unbounded if left is None else left, unbounded if right is None else right) if key == "window_size"
              else -1 if left is None else left)
    assert last_call(module)[key] == wanted


@pytest.mark.parametrize("name", sorted(WINDOW_ARGUMENT))
def test_windows_aligned_top_left_are_declined_where_lengths_differ(plugin, kernels, name):
    kernel = kernels[name]
    call = dict(batch=dense_batch(name), window_left=16, alignment="top_left")
    reason = extended_decline(plugin, kernel, **call)
    assert "a sliding window aligned top_left with seq_q != seq_kv" in reason, reason
    # Equal lengths put both diagonals in the same place.
    check_extended_call(plugin, kernel, **call, seq_q=48, seq_kv=48)


def test_the_window_tests_can_fail(plugin, kernels):
    """A window dropped, or taken top-left where flash-attn aligns it bottom-right, is caught."""
    kernel = kernels["flash-attn-3"]
    spec, q, k, v, mask, tensors = make_extended_call(plugin, kernel, window_left=16, window_right=8)
    unwindowed = dataclasses.replace(spec, window_left=None, window_right=None)
    top_left = dataclasses.replace(spec, causal_alignment="top_left")
    want = extended_reference(spec, q, k, v, mask, tensors)
    for wrong in (unwindowed, top_left):
        error = (extended_reference(wrong, q, k, v, mask, tensors) - want).norm() / want.norm()
        assert error > 10 * CASES["flash-attn-3"]["tolerance"]


SOFTCAP = 1.5  # below the scores' spread here (scale 0.3, head_dim 64), so that it bends them
SOFTCAP_ARGUMENT = {"flash-attn-2": ("flash_attn", "softcap"), "flash-attn-3": ("flash_attn_interface", "softcap"),
                    "flash-attn-3-fp8": ("flash_attn_interface", "softcap"),
                    "flash-attn-4": ("flash_attn.cute.interface", "softcap"),
                    "flashinfer-prefill": ("flashinfer", "logits_soft_cap")}


@pytest.mark.parametrize("causal", [None, "bottom_right"])
@pytest.mark.parametrize("name", DENSE)
def test_softcap(plugin, kernels, name, causal):
    kernel = kernels[name]
    call = dict(batch=dense_batch(name), softcap=SOFTCAP, causal=causal)
    if "softcap" not in kernel.extensions:
        assert extended_decline(plugin, kernel, **call) == "the call has a softcap of 1.5, which this kernel does not compute"
        return
    spec, q, k, v, mask, tensors = check_extended_call(plugin, kernel, **call)
    module, key = SOFTCAP_ARGUMENT[name]
    assert last_call(module)[key] == SOFTCAP
    # The test can fail: without the softcap the output is far from the call's.
    uncapped = extended_reference(dataclasses.replace(spec, softcap=0.0), q, k, v, mask, tensors)
    want = extended_reference(spec, q, k, v, mask, tensors)
    assert (uncapped - want).norm() / want.norm() > 10 * CASES[name]["tolerance"]


def test_softcap_with_a_window_and_gqa(plugin, kernels):
    for name in ("flash-attn-2", "flash-attn-3", "flash-attn-4", "flashinfer-prefill"):
        check_extended_call(plugin, kernels[name], batch=dense_batch(name), heads_q=4, heads_kv=2, softcap=SOFTCAP,
                            window_left=12, causal="bottom_right")


def slopes(*shape):
    return torch.linspace(0.05, 0.4, math.prod(shape)).view(*shape).to(torch.float32)


@pytest.mark.parametrize("causal", [None, "bottom_right"])
@pytest.mark.parametrize("per_batch", [False, True])
def test_flash_attn_2_alibi(plugin, kernels, per_batch, causal):
    kernel = kernels["flash-attn-2"]
    alibi = slopes(2, 4) if per_batch else slopes(4)
    spec, q, k, v, mask, tensors = check_extended_call(plugin, kernel, alibi=alibi, causal=causal, heads_q=4,
                                                       heads_kv=2)
    assert last_call("flash_attn")["alibi_slopes"].dtype == torch.float32
    no_alibi = dict(tensors, alibi_slopes=None)
    want = extended_reference(spec, q, k, v, mask, tensors)
    assert (extended_reference(spec, q, k, v, mask, no_alibi) - want).norm() / want.norm() > 0.1


def test_flash_attn_2_alibi_after_the_softcap_in_a_window_from_bf16_slopes(plugin, kernels):
    # The record may hold the slopes in another dtype: FlashAttention-2 takes fp32 only.
    check_extended_call(plugin, kernels["flash-attn-2"], alibi=slopes(4).to(torch.bfloat16), softcap=SOFTCAP,
                        window_left=20, window_right=5)


def test_flash_attn_2_declines_alibi_aligned_top_left(plugin, kernels):
    kernel = kernels["flash-attn-2"]
    reason = extended_decline(plugin, kernel, alibi=slopes(4), alignment="top_left")
    assert "ALiBi aligned top_left with seq_q != seq_kv" in reason, reason
    check_extended_call(plugin, kernel, alibi=slopes(4), alignment="top_left", seq_q=48, seq_kv=48)


@pytest.mark.parametrize("name", sorted(set(DENSE) - {"flash-attn-2"}))
def test_alibi_is_declined_by_the_other_libraries(plugin, kernels, name):
    reason = extended_decline(plugin, kernels[name], batch=dense_batch(name), alibi=slopes(4))
    assert reason == "the call has ALiBi slopes, which this kernel does not compute"


SINKS = torch.tensor([0.5, 2.0, -1.0, 3.0], dtype=torch.float32)


@pytest.mark.parametrize("causal", [None, "bottom_right"])
def test_flash_attn_4_sinks(plugin, kernels, causal):
    kernel = kernels["flash-attn-4"]
    spec, q, k, v, mask, tensors = check_extended_call(plugin, kernel, sinks=SINKS, causal=causal, heads_q=4,
                                                       heads_kv=2, window_left=24, softcap=SOFTCAP)
    sink = last_call("flash_attn.cute.interface")["learnable_sink"]
    assert sink.dtype == torch.float32 and torch.equal(sink, SINKS)
    want = extended_reference(spec, q, k, v, mask, tensors)
    assert (extended_reference(spec, q, k, v, mask, dict(tensors, sinks=None)) - want).norm() / want.norm() > 0.1


def test_flash_attn_4_declines_sinks_and_softcaps_where_its_kernels_take_none(plugin, kernels):
    kernel = kernels["flash-attn-4"]
    try:
        kernel.compute_capability = (8, 0)
        assert extended_decline(plugin, kernel, sinks=SINKS) == "sinks: FlashAttention-4's kernel for sm8x takes no learnable_sink"
        kernel.compute_capability = (10, 0)
        reason = extended_decline(plugin, kernel, sinks=SINKS, softcap=SOFTCAP, head_dim=256)
        assert reason == "a softcap and sinks: FlashAttention-4's sm100 kernel for head dims (256, 256) takes neither"
        assert kernel.decline_reason(make_extended_call(plugin, kernel, sinks=SINKS)[0]) is None
    finally:
        kernel.compute_capability = (9, 0)


@pytest.mark.parametrize("name", sorted(set(DENSE) - {"flash-attn-4"}))
def test_sinks_are_declined_by_the_other_libraries(plugin, kernels, name):
    reason = extended_decline(plugin, kernels[name], batch=dense_batch(name), sinks=SINKS)
    assert reason == "the call has attention sinks, which this kernel does not compute"


def test_flashinfer_prefill_declines_a_window_beside_a_mask(plugin, kernels):
    kernel = kernels["flashinfer-prefill"]
    mask = random_mask("bool", 1, 4, 40, 72)
    reason = extended_decline(plugin, kernel, batch=1, mask=mask, window_left=16)
    assert reason.startswith("a sliding window with a mask"), reason


# Ragged and paged batches: each sequence's window bottom-right within it.

@pytest.mark.parametrize("page_size", [0, 16])
@pytest.mark.parametrize("name", ["flash-attn-4-varlen", "flashinfer-batch-prefill"])
def test_ragged_prefill_with_a_window_and_softcap(plugin, kernels, name, page_size):
    kernel = kernels[name]
    call = make_ragged_call(plugin, kernel, [5, 17, 1, 32], [40, 17, 9, 64], page_size=page_size,
                            causal="bottom_right", window_left=6, softcap=SOFTCAP)
    check_ragged(plugin, kernel, call)
    if name == "flashinfer-batch-prefill":
        plan = flashinfer_plan()
        assert (plan["window_left"], plan["logits_soft_cap"]) == (6, SOFTCAP)
    else:
        varlen = last_call("flash_attn.cute.interface")
        assert (varlen["window_size"], varlen["softcap"]) == ((6, None), SOFTCAP)


def test_flash_attn_4_varlen_windows_on_both_sides_and_sinks(plugin, kernels):
    kernel = kernels["flash-attn-4-varlen"]
    sinks = torch.linspace(-1.0, 2.0, 8).to(torch.float32)
    call = make_ragged_call(plugin, kernel, [5, 17, 1, 32], [40, 17, 9, 64], page_size=16, window_left=6,
                            window_right=3, sinks=sinks)
    check_ragged(plugin, kernel, call)
    assert torch.equal(last_call("flash_attn.cute.interface")["learnable_sink"], sinks)


@pytest.mark.parametrize("page_size", [1, 16])
def test_flashinfer_decode_with_a_window_and_softcap(plugin, kernels, page_size):
    kernel = kernels["flashinfer-decode"]
    # One query row: any right window hides nothing, bottom-right.
    call = make_ragged_call(plugin, kernel, [1] * 4, DECODE_K_LENS, page_size=page_size, window_left=7,
                            window_right=2, softcap=SOFTCAP)
    check_ragged(plugin, kernel, call)
    assert (flashinfer_plan()["window_left"], flashinfer_plan()["logits_soft_cap"]) == (7, SOFTCAP)


def test_flashinfer_batch_prefill_declines_a_right_window_and_what_it_does_not_compute(plugin, kernels):
    kernel = kernels["flashinfer-batch-prefill"]
    reason = ragged_decline(plugin, kernel, [5, 17], [40, 17], window_left=6, window_right=2)
    assert "FlashInfer takes a left window only" in reason, reason
    # Causal clips the right side to the diagonal, which FlashInfer's causal flag does.
    assert kernel.decline_reason(make_ragged_call(plugin, kernel, [5, 17], [40, 17], window_left=6, window_right=2,
                                                  causal="bottom_right").spec) is None
    assert ragged_decline(plugin, kernel, [5], [40], sinks=torch.zeros(8)) == (
        "the call has attention sinks, which this kernel does not compute")
    top_left = make_ragged_call(plugin, kernel, [5, 17], [40, 17], window_left=6)
    top_left = dataclasses.replace(top_left.spec, causal_alignment="top_left")
    assert "aligned top_left" in kernel.decline_reason(top_left)


def test_the_stand_ins_reject_extension_arguments_as_the_libraries_do(plugin):
    flash_attn = importlib.import_module("flash_attn")
    interface = importlib.import_module("flash_attn.cute.interface")
    q = torch.randn(1, 4, 2, 64).to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="ALiBi slopes must have dtype fp32"):
        flash_attn.flash_attn_func(q, q, q, alibi_slopes=torch.zeros(2, dtype=torch.float64))
    with pytest.raises(AssertionError, match="learnable_sink must have shape"):
        interface.flash_attn_func(q, q, q, learnable_sink=torch.zeros(3))
    # FlashAttention-2's own reading: a right side >= seq_kv is unbounded (mha_fwd), so with 8 queries
    # over 2 keys, a window (-1, 2) shows query 0 both keys, where the record's bottom-right window
    # would show it none (its last key 0 + 2 - 8 + 2 < 0).
    q8 = torch.randn(1, 8, 1, 64).to(torch.bfloat16)
    k2 = torch.randn(1, 2, 1, 64).to(torch.bfloat16)
    out = flash_attn.flash_attn_func(q8, k2, k2, window_size=(-1, 2))
    assert out[0, 0].abs().sum() > 0
