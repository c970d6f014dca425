"""sageattn-triton and sage2-cuda: SageAttention (PyPI `sageattention`, thu-ml/SageAttention).

Written against sageattention 1.0.6 (PyPI; sageattention/core.py) and SageAttention 2.2.0 (GitHub
main: sageattention/core.py, quant.py, triton/quant_per_thread.py, csrc/qattn/pybind_sm*.cpp).

sageattn-triton: SageAttention's Triton kernel, INT8 Q·Kᵀ with a scale per block of Q rows and of
keys, fp16 P·V, quantization inside the call (neither version exposes it separately for this
kernel). In 1.0.x that is `sageattn(q, k, v, tensor_layout, is_causal, sm_scale, smooth_k)`; in 2.x
`sageattn` dispatches to a CUDA kernel by GPU and the Triton one is
`sageattn_qk_int8_pv_fp16_triton(q, k, v, tensor_layout, quantization_backend, is_causal, attn_mask,
sm_scale, smooth_k, return_lse)`, which this adapter uses when present. Layout "HND" (bhsd), GQA
native, causal top-left (the causal kernel keeps key j for row i when j <= i), sm_scale always passed,
--no_k_smooth -> smooth_k=False. 1.0.x subtracts K's mean from the caller's K in place (`k -= km`),
so this adapter does that subtraction itself in prepare(), on a copy, in K's dtype as 1.0.x does, and
calls with smooth_k=False: the same arithmetic, without writing into the call's K. Masks, where the
installed function takes `attn_mask` (2.x main): bool as is (True = may attend); float multiplied by
log2(e) and cast to Q's dtype (the kernel adds the mask to scores already in the log2 domain and
asserts the dtype); causal + mask is folded into the mask (the function asserts no mask when causal).

sage2-cuda: SageAttention2's CUDA kernel alone, "timed with quantization as preparation, as
SageAttention's own numbers are quoted". prepare() does what sageattn_qk_int8_pv_fp8_cuda_sm90 (on
sm90) or sageattn_qk_int8_pv_fp8_cuda (on sm89 and sm120) does before its kernel: pads head dims to 64
or 128, takes K's mean (unless --no_k_smooth), quantizes Q and K to INT8 with SageAttention's own
functions (quant.per_warp_int8 or triton.quant_per_thread.per_thread_int8, K smoothed inside, with
that build's block sizes), pads V to a multiple of 128 keys (sm90), quantizes V to FP8 e4m3 per
channel (quant.per_channel_fp8; scale_max 2.25 for fp32+fp16 accumulation) and allocates the output;
run() calls only the attention kernel of the compiled extension (_qattn_sm90 / _qattn_sm89, or 2.0's
_qattn), with the arguments those functions pass it. Mapping: --quant_gran per_warp / per_thread
(SageAttention's codes 2 / 3); --pv_accum_dtype fp32+fp32 (both builds), fp32 and fp32+fp16 (sm89
build, where its extension has the kernel); --no_k_smooth; GQA native; causal top-left.

Declines: sageattn-triton (always per-block INT8, whatever --quant_gran says): dtypes other than fp16 and bf16 (2.x)
or fp16, bf16, fp32 (1.0.x); head dims above 128 (2.x) or other than 64, 96, 128 (1.0.x); masks
unless the installed function takes them; head_dim_vo != head_dim_qk; bottom-right causal with seq_q
!= seq_kv. sage2-cuda: --quant_gran per_block; a --pv_accum_dtype the GPU's build has no kernel for;
GPUs other than sm89, sm90, sm120/121 (those SageAttention builds its FP8 kernels for); dtypes other
than fp16 and bf16; head dims above 128; head_dim_vo != head_dim_qk; masks; bottom-right causal with
seq_q != seq_kv.
"""

import dataclasses
import importlib
import inspect
from typing import Any, Callable

import torch

import attnreplay_plugin as ar
from _adapter_common import additive_bias, gpu_capability, visible_keys

NAMES = ["sageattn-triton", "sage2-cuda"]
sageattention = ar.optional_import("sageattention", kernels=NAMES)

LOG2E = 1.4426950408889634
TENSOR_LAYOUT_HND = 1                                   # SageAttention's code for "HND"
GRANULARITY_CODES = {"per_warp": 2, "per_thread": 3}    # its qk_quant_gran codes


def installed_version() -> str:
    try:
        from importlib import metadata
        return metadata.version("sageattention")
    except Exception:
        return "(version unknown)"


@dataclasses.dataclass
class TritonInputs:
    q: Any
    k: Any
    v: Any
    mask: Any
    smooth_k: bool
    spec: Any


class SageAttentionTriton(ar.Kernel):
    name = "sageattn-triton"
    summary = "SageAttention's Triton kernel: INT8 Q·K per block, fp16 P·V, quantized inside the call"
    # sageattn() smooths K inside the call, which prepare() does here: the headline is both, as users call it.
    headline = "call"
    layout = "bhsd"
    native_gqa = True
    causal_alignments = ("top_left",)
    reduced_precision = "int8"

    def __init__(self):
        triton_2x = getattr(sageattention, "sageattn_qk_int8_pv_fp16_triton", None)
        if triton_2x is not None:
            self._attention = triton_2x
            self._smooths_k_in_place = False
            self.dtypes = ("float16", "bfloat16")
            self.head_dims = None
            self.masks = ("bool", "float") if "attn_mask" in inspect.signature(triton_2x).parameters else ()
        else:
            self._attention = sageattention.sageattn
            self._smooths_k_in_place = True
            self.dtypes = ("float16", "bfloat16", "float32")
            self.head_dims = (64, 96, 128)
            self.masks = ()

    # Its Triton kernels quantize Q and K per block, whatever --quant_gran says (which selects among
    # the granularities of the kernels that have several): the summary says so, rather than the
    # kernel missing from every table run with the default per_warp.
    def supports(self, spec):
        if spec.head_dim_qk > 128:
            return f"head_dim {spec.head_dim_qk} is above 128, SageAttention's largest"
        return None

    def prepare(self, inputs):
        spec = inputs.spec
        k, smooth_k = inputs.k, spec.quant.k_smooth
        if self._smooths_k_in_place and smooth_k:
            # 1.0.x would subtract the mean from the call's own K (`k -= km`): the same, on a copy.
            k = k - k.mean(dim=2, keepdim=True)
            smooth_k = False
        mask = None
        if inputs.mask is not None:
            if inputs.mask.dtype == torch.bool:
                mask = visible_keys(inputs.mask, spec)
            else:
                # The kernel adds the mask to scores already in the log2 domain, and wants Q's dtype.
                mask = (additive_bias(inputs.mask, spec, torch.float32) * LOG2E).to(inputs.q.dtype)
        return TritonInputs(inputs.q, k, inputs.v, mask, smooth_k, spec)

    def run(self, prepared):
        spec = prepared.spec
        options = dict(tensor_layout="HND", is_causal=spec.is_causal and prepared.mask is None, sm_scale=spec.scale,
                       smooth_k=prepared.smooth_k)
        if prepared.mask is not None:
            options["attn_mask"] = prepared.mask
        return self._attention(prepared.q, prepared.k, prepared.v, **options)


@dataclasses.dataclass(frozen=True)
class Sage2Build:
    """One of SageAttention2's FP8 kernel extensions and how its own Python wrapper drives it."""

    arch: str
    module: Any
    block_q: int
    warp_q: int
    block_k: int
    warp_k: int
    pad_v_to: int       # V's keys padded to a multiple of this before FP8 quantization (1: none)
    kernels: dict       # --pv_accum_dtype -> (kernel name in the extension, V's FP8 scale_max)


# As sageattn_qk_int8_pv_fp8_cuda_sm90 and sageattn_qk_int8_pv_fp8_cuda (core.py) call them.
SM90_KERNELS = {"fp32+fp32": ("qk_int8_sv_f8_accum_f32_fuse_v_scale_attn_inst_buf", 448.0)}
SM89_KERNELS = {"fp32": ("qk_int8_sv_f8_accum_f32_fuse_v_scale_attn", 448.0),
                "fp32+fp32": ("qk_int8_sv_f8_accum_f32_fuse_v_scale_attn_inst_buf", 448.0),
                "fp32+fp16": ("qk_int8_sv_f8_accum_f16_fuse_v_scale_attn_inst_buf", 2.25)}


def load_build(arch: str, module_names, geometry: dict, kernels: dict):
    """(Sage2Build, None), or (None, why none of `module_names` imports)."""
    errors = []
    for module_name in module_names:
        try:
            module = importlib.import_module(module_name)
        except Exception as error:
            errors.append(f"{module_name}: {type(error).__name__}: {error}")
            continue
        present = {accum: entry for accum, entry in kernels.items() if hasattr(module, entry[0])}
        if present:
            return Sage2Build(arch, module, kernels=present, **geometry), None
        errors.append(f"{module_name} has none of {sorted(name for name, _ in kernels.values())}")
    return None, "; ".join(errors)


@dataclasses.dataclass
class Sage2Inputs:
    kernel: Callable
    q: Any
    k: Any
    v: Any
    out: Any
    q_scale: Any
    k_scale: Any
    v_scale: Any
    is_causal: int
    granularity: int
    scale: float
    head_dim: int


class SageAttention2Cuda(ar.Kernel):
    name = "sage2-cuda"
    summary = "SageAttention2's CUDA kernel alone (INT8 Q·K, FP8 P·V), its own quantization as preparation"
    layout = "bhsd"
    native_gqa = True
    causal_alignments = ("top_left",)
    reduced_precision = "int8"
    # (major, minor) of the GPU; None: asked of torch on first use. Tests set it.
    compute_capability = None

    def __init__(self):
        self.quant = importlib.import_module("sageattention.quant")
        self.per_thread = importlib.import_module("sageattention.triton.quant_per_thread")
        self.builds, self.unavailable_builds = find_builds()   # by arch: Sage2Build / why it is missing

    def _build(self):
        """(Sage2Build, None) for this GPU, or (None, the reason)."""
        capability = gpu_capability(self) or ()
        if capability == (9, 0):
            arch = "sm90"
        elif capability in ((8, 9), (12, 0), (12, 1)):
            arch = "sm89"  # SageAttention runs sm120 and sm121 through its sm89 wrapper and extension
        else:
            found = "sm" + "".join(map(str, capability)) if capability else "no GPU"
            return None, f"SageAttention2's FP8 kernels are built for sm89, sm90 and sm120, not {found}"
        if arch not in self.builds:
            return None, f"SageAttention2's {arch} extension does not import: {self.unavailable_builds.get(arch)}"
        return self.builds[arch], None

    def supports(self, spec):
        build, reason = self._build()
        if reason:
            return reason
        if spec.quant.quant_gran not in GRANULARITY_CODES:
            return (f"--quant_gran {spec.quant.quant_gran} is not supported: SageAttention2's CUDA kernels quantize Q "
                    f"and K per warp or per thread")
        if spec.quant.pv_accum_dtype not in build.kernels:
            return (f"--pv_accum_dtype {spec.quant.pv_accum_dtype} is not supported by SageAttention2's {build.arch} "
                    f"kernels (takes {', '.join(build.kernels)})")
        if spec.head_dim_qk > 128:
            return f"head_dim {spec.head_dim_qk} is above 128, SageAttention2's largest"
        return None

    def prepare(self, inputs):
        spec = inputs.spec
        build, reason = self._build()
        if reason:
            raise RuntimeError(reason)
        kernel_name, v_scale_max = build.kernels[spec.quant.pv_accum_dtype]
        q, k, v = inputs.q, inputs.k, inputs.v
        head_dim = 64 if spec.head_dim_qk <= 64 else 128
        if head_dim != spec.head_dim_qk:
            q, k, v = (torch.nn.functional.pad(t, (0, head_dim - spec.head_dim_qk)) for t in (q, k, v))
        k_mean = k.mean(dim=2, keepdim=True) if spec.quant.k_smooth else None
        if spec.quant.quant_gran == "per_warp":
            q8, q_scale, k8, k_scale = self.quant.per_warp_int8(
                q, k, k_mean, tensor_layout="HND", BLKQ=build.block_q, WARPQ=build.warp_q, BLKK=build.block_k)
        else:
            q8, q_scale, k8, k_scale = self.per_thread.per_thread_int8(
                q, k, k_mean, tensor_layout="HND", BLKQ=build.block_q, WARPQ=build.warp_q, BLKK=build.block_k,
                WARPK=build.warp_k)
        pad_keys = -spec.seq_kv % build.pad_v_to
        if pad_keys:
            v = torch.cat([v, v.new_zeros(v.shape[0], v.shape[1], pad_keys, v.shape[3])], dim=2)
        # Versions before fp32+fp16 accumulation (2.1.0) have no scale_max; 448 is their fixed value.
        scale_max = {} if v_scale_max == 448.0 else {"scale_max": v_scale_max}
        v8, v_scale, _ = self.quant.per_channel_fp8(v, tensor_layout="HND", smooth_v=False, **scale_max)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        return Sage2Inputs(getattr(build.module, kernel_name), q8, k8, v8, out, q_scale, k_scale, v_scale,
                           int(spec.is_causal), GRANULARITY_CODES[spec.quant.quant_gran], spec.scale,
                           spec.head_dim_vo)

    def run(self, prepared):
        p = prepared
        p.kernel(p.q, p.k, p.v, p.out, p.q_scale, p.k_scale, p.v_scale, TENSOR_LAYOUT_HND, p.is_causal,
                 p.granularity, p.scale, 0)
        return p.out[..., :p.head_dim]


def find_builds():
    """({arch: Sage2Build}, {arch: why its extension is missing}) for the sm90 and sm89 builds."""
    builds, missing = {}, {}
    for arch, module_names, geometry, kernels in (
            ("sm90", ["sageattention._qattn_sm90"],
             dict(block_q=64, warp_q=16, block_k=128, warp_k=128, pad_v_to=128), SM90_KERNELS),
            ("sm89", ["sageattention._qattn_sm89", "sageattention._qattn"],
             dict(block_q=128, warp_q=32, block_k=64, warp_k=64, pad_v_to=1), SM89_KERNELS)):
        build, error = load_build(arch, module_names, geometry, kernels)
        if build:
            builds[arch] = build
        else:
            missing[arch] = error
    return builds, missing


def register_sage2():
    if not hasattr(sageattention, "sageattn_qk_int8_pv_fp8_cuda"):
        ar.unavailable("sage2-cuda", f"sageattention {installed_version()} has no SageAttention2 CUDA kernels "
                                     f"(sageattn_qk_int8_pv_fp8_cuda, from 2.0 on)")
        return
    quant = ar.optional_import("sageattention.quant", kernels=["sage2-cuda"])
    per_thread = ar.optional_import("sageattention.triton.quant_per_thread", kernels=["sage2-cuda"])
    if quant is None or per_thread is None:
        return
    builds, missing = find_builds()
    if not builds:
        ar.unavailable("sage2-cuda", "no SageAttention2 FP8 kernel extension imports: " + "; ".join(missing.values()))
        return
    ar.register(SageAttention2Cuda())


def register_triton():
    if not hasattr(sageattention, "sageattn_qk_int8_pv_fp16_triton"):
        parameters = inspect.signature(sageattention.sageattn).parameters
        if not {"tensor_layout", "smooth_k"} <= set(parameters):
            ar.unavailable("sageattn-triton", f"sageattention {installed_version()}'s sageattn has no tensor_layout or "
                                              f"smooth_k argument (1.0.3 and later have them)")
            return
    ar.register(SageAttentionTriton())


if sageattention is not None:
    register_triton()
    register_sage2()
