"""attnreplay's plug-in kernel API, version 1 (docs/plugins.md).

A plug-in is a Python file or importable module that registers kernels here; `attnreplay run
--kernel-module FILE` loads it into the attnreplay process, which then times and judges its
kernels exactly as it does its built-in ones, on the same tensors, CUDA context and stream.

    import attnreplay_plugin as ar

    class MyKernel(ar.Kernel):
        name = "my-flash"
        summary = "my Triton flash attention"
        layout = "bhsd"                      # what run() gets: (b, h, s, d) contiguous
        causal_alignments = ("top_left",)    # the causal diagonals it computes

        def run(self, inputs):               # -> the output, in `layout`, on `device`
            return my_flash(inputs.q, inputs.k, inputs.v, causal=inputs.spec.is_causal,
                            scale=inputs.spec.scale)

    ar.register(MyKernel())

A kernel's capabilities are data (the class attributes below); a call outside them is reported
`not_supported` with the reason, and `supports(spec)` adds any check of its own. `prepare(inputs)`,
when overridden, is the kernel's input preparation (quantization, a layout change): it is timed
alone with `run()` and `run()` is timed alone, as for the built-in kernels.
"""

from __future__ import annotations

import dataclasses
import time
import importlib
import importlib.util
import os
import sys
import traceback
from typing import Any, Callable, Optional, Sequence

API_VERSION = 1

LAYOUTS = ("bhsd", "bshd", "thd")
CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")
MASK_KINDS = ("bool", "float")
# What a kernel may compute beyond plain masked, causal attention (docs/format.md): a call that has
# one of these reaches only a kernel that declares it in `extensions`; the others refuse it by name.
EXTENSIONS = ("window", "softcap", "alibi", "sinks")


class NotSupported(Exception):
    """Raised from prepare() or run() when only the real inputs show that the kernel cannot take
    the call (a library's own dispatcher finds no implementation): the row is `not_supported`
    with this message, not `failed`."""


@dataclasses.dataclass(frozen=True)
class QuantOptions:
    """The run's quantization flags (docs/quantized.md), for kernels that map them."""

    quant_gran: str = "per_warp"         # per_block, per_warp, per_thread
    k_smooth: bool = True                # False under --no_k_smooth
    pv_accum_dtype: str = "fp32+fp32"    # fp32, fp32+fp32, fp32+fp16
    fp8_scale: str = "per_head"          # per_tensor, per_head


@dataclasses.dataclass(frozen=True)
class CallSpec:
    """One attention call without its tensors: what supports() decides on.

    Dims are the call's own (heads_kv < heads_q for GQA, whatever the kernel is given). `layout`
    is the layout the kernel receives its tensors in, `model_layout` the one the model used.
    """

    index: int
    op: str
    dtype: str                 # torch's name: "bfloat16", "float16", "float32", ...
    device: str                # where the kernel's tensors are: "cpu" or "cuda"
    layout: str
    model_layout: str
    batch: int
    heads_q: int
    heads_kv: int
    seq_q: int
    seq_kv: int
    head_dim_qk: int
    head_dim_vo: int
    is_causal: bool
    causal_alignment: str      # "top_left" (torch SDPA) or "bottom_right" (flash-attn)
    scale: float               # always set: the call's, or 1/sqrt(head_dim_qk)
    mask_kind: Optional[str]   # None, "bool" (True = may attend) or "float" (added to the scores)
    mask_shape: Optional[tuple]
    metadata: dict
    quant: QuantOptions
    # A ragged batch (model_layout "thd", docs/format.md): each sequence's queries and keys, and
    # the page size of a paged one (0 when packed). seq_q and seq_kv are then the packed totals.
    q_lens: tuple = ()
    k_lens: tuple = ()
    page_size: int = 0
    # A sliding window (docs/format.md): query i sees keys i + o - window_left .. i + o + window_right,
    # o = seq_kv - seq_q for causal_alignment "bottom_right" (per sequence in a ragged batch) and 0 for
    # "top_left", whether or not the call is causal; None: unbounded on that side. Causality, where
    # set, applies as well. Only a kernel with "window" in `extensions` sees a call that has one.
    window_left: Optional[int] = None
    window_right: Optional[int] = None
    # > 0: each scaled score s becomes softcap * tanh(s / softcap), before mask and ALiBi; 0: none.
    softcap: float = 0.0
    # The shapes of the call's ALiBi slopes and sinks (Inputs carries the tensors); None: it has none.
    alibi_shape: Optional[tuple] = None
    sinks_shape: Optional[tuple] = None

    @property
    def torch_dtype(self):
        import torch
        return getattr(torch, self.dtype)

    @property
    def sequence_lengths(self) -> list:
        """(seq_q, seq_kv) of each sequence: a ragged batch's own, else the call's."""
        return list(zip(self.q_lens, self.k_lens)) if self.q_lens else [(self.seq_q, self.seq_kv)]

    @property
    def is_gqa(self) -> bool:
        return self.heads_q != self.heads_kv


@dataclasses.dataclass
class Inputs:
    """The tensors of one call, as the kernel asked for them: q, k, v contiguous in its layout on
    its device (K and V with heads_q heads unless the kernel takes GQA natively), and the mask as
    the model passed it, broadcastable to (batch, heads_q, seq_q, seq_kv)."""

    q: Any
    k: Any
    v: Any
    mask: Any
    spec: CallSpec
    # For a kernel of layout "thd": int32 tensors on its device, as flash-attn's varlen ops take
    # them. cu_seqlens_q (batch + 1) always; cu_seqlens_k with packed keys; block_table (batch,
    # pages per sequence) and seqused_k (batch) with pages, for a kernel that sets `paged`.
    cu_seqlens_q: Any = None
    cu_seqlens_k: Any = None
    seqused_k: Any = None
    block_table: Any = None
    # For a kernel that declares "alibi" or "sinks" in `extensions`, the call's tensors as the record
    # holds them (their dtype, on the kernel's device); None where the call has none.
    # alibi_slopes: (heads_q) or (batch, heads_q), score -= slope * |i + o - j| after softcap.
    # sinks: (heads_q), one logit per head in each row's softmax denominator, adding no value.
    alibi_slopes: Any = None
    sinks: Any = None


class Kernel:
    """Base class of a plug-in kernel. Override the attributes that differ, and run()."""

    name: str = ""
    summary: str = ""
    device: str = "cuda"                       # "cuda" or "cpu"
    layout: str = "bhsd"                       # what run() gets and returns: "bhsd", "bshd" or "thd"
    # With layout "thd" the kernel takes a ragged batch as one: q (total_q, heads, dim), k and v
    # packed (total_k, heads_kv, dim) with cu_seqlens_k, or with `paged` the KV cache's pages
    # (pages, page_size, heads_kv, dim) with block_table and seqused_k (else a paged batch's keys
    # come gathered and packed); it returns (total_q, heads_q, head_dim_vo). Kernels of the other
    # layouts get a ragged batch one sequence at a time, as dense calls.
    paged: bool = False
    dtypes: Sequence[str] = ("float16", "bfloat16")
    head_dims: Optional[Sequence[int]] = None  # head_dim_qk values taken; None: any
    different_vo: bool = False                 # head_dim_vo may differ from head_dim_qk
    native_gqa: bool = False                   # K, V with fewer heads taken as they are
    masks: Sequence[str] = ()                  # mask kinds taken ("bool", "float"); (): none
    causal_alignments: Sequence[str] = CAUSAL_ALIGNMENTS  # causal diagonals computed; (): not causal
    reduced_precision: Optional[str] = None    # "int8", "float8_e4m3fn": --refcheck's thresholds
    output_dtype: Optional[str] = None         # None: the inputs' dtype
    # What the headline time is when prepare() has work: "kernel", run() alone, the kernel (the whole
    # call beside it, as kernels are quoted); "call", prepare() then run(), a library's function as
    # users call it, which does that work inside (run() alone beside it); "run", run() is a
    # library's function as users call it and prepare() set-up they do once (a block mask).
    headline: str = "kernel"
    # What it computes of a call's window, softcap, ALiBi and sinks (EXTENSIONS): the spec and the
    # inputs carry them; a call with one not listed here is refused for it, named. A literal tuple
    # in an adapter, which attnreplay reads without importing it.
    extensions: Sequence[str] = ()

    def supports(self, spec: CallSpec) -> Optional[str]:
        """None when the kernel can run the call, else the reason, which the user reads."""
        return None

    def prepare(self, inputs: Inputs) -> Any:
        """Input preparation (timed as such when overridden); what it returns is run()'s argument."""
        return inputs

    def run(self, prepared: Any):
        """Computes the attention output: (batch, heads_q, seq_q, head_dim_vo) in `layout`."""
        raise NotImplementedError(f"{type(self).__name__}.run")

    def warm_up(self, prepared: Any) -> bool:
        """Optional: what compiles or autotunes the kernel for this call (a first run of a
        torch.compile'd function, say), done once before any timing. attnreplay reports its time
        as the call's compile_s, apart from every figure; return False when nothing was compiled."""
        return False

    # Optional, for a kernel that compiles per kind of call: `precompile(spec) -> Optional[str]`
    # compiles ahead for calls like `spec` on inputs of its own, and returns the kind it compiled
    # for, in words, or None where that kind is compiled already. A replay calls it for every call
    # it will bring, on a thread of its own beside the other kernels' timings, before the kernel's
    # part of the first call; warm_up() then finds the compilation done.

    # -- what attnreplay calls --------------------------------------------------------------

    def decline_reason(self, spec: CallSpec) -> Optional[str]:
        """The capability checks over the class attributes, then supports()."""
        # First, as attnreplay's runner refuses them (missing_extensions) before asking a kernel.
        missing = [what for extension, what in _call_extensions(spec) if extension not in self.extensions]
        if missing:
            return f"the call has {' and '.join(missing)}, which this kernel does not compute"
        if (self.layout == "thd") != (spec.model_layout == "thd"):
            return ("takes ragged (thd) batches only" if self.layout == "thd"
                    else "takes dense calls; a ragged batch comes one sequence at a time")
        if spec.dtype not in self.dtypes:
            return f"dtype {spec.dtype} is not supported (takes {', '.join(self.dtypes)})"
        if self.head_dims is not None and spec.head_dim_qk not in self.head_dims:
            return f"head_dim {spec.head_dim_qk} is not supported (takes {', '.join(map(str, self.head_dims))})"
        if spec.head_dim_vo != spec.head_dim_qk and not self.different_vo:
            return f"head_dim_vo {spec.head_dim_vo} != head_dim_qk {spec.head_dim_qk} is not supported"
        if spec.mask_kind is not None and spec.mask_kind not in self.masks:
            return f"{spec.mask_kind} masks are not supported"
        # Equal lengths put both diagonals in the same place.
        if spec.is_causal:
            if not self.causal_alignments:
                return "causal attention is not supported"
            unequal = any(q != k for q, k in spec.sequence_lengths)
            if spec.causal_alignment not in self.causal_alignments and unequal:
                return (f"causal with {spec.causal_alignment} alignment and seq_q {spec.seq_q} != seq_kv "
                        f"{spec.seq_kv} is not supported (computes {', '.join(self.causal_alignments)})")
        return self.supports(spec)

    def has_preparation(self) -> bool:
        return type(self).prepare is not Kernel.prepare


def _call_extensions(spec: CallSpec) -> list:
    """(extension, in words) for each of EXTENSIONS the call has, worded as attnreplay's refusals are."""
    found = []
    if spec.window_left is not None or spec.window_right is not None:
        sides = [f"{side} {value}" for side, value in (("left", spec.window_left), ("right", spec.window_right))
                 if value is not None]
        found.append(("window", f"a sliding window ({', '.join(sides)})"))
    if spec.softcap > 0:
        found.append(("softcap", f"a softcap of {spec.softcap:g}"))
    if spec.alibi_shape is not None:
        found.append(("alibi", "ALiBi slopes"))
    if spec.sinks_shape is not None:
        found.append(("sinks", "attention sinks"))
    return found


def kernel(name: str, **capabilities) -> Callable:
    """Registers a function `fn(inputs) -> output` as a kernel without preparation:

        @ar.kernel("torch-sdpa-plugin", device="cpu", dtypes=("float32",))
        def sdpa(inputs): ...
    """

    def wrap(fn: Callable) -> Callable:
        attributes = {"name": name, "summary": capabilities.pop("summary", fn.__doc__ or ""), **capabilities}
        unknown = [key for key in attributes if not hasattr(Kernel, key)]
        if unknown:
            raise TypeError(f"attnreplay_plugin.kernel: unknown capabilities {unknown}")
        function_kernel = type(fn.__name__, (Kernel,), {**attributes, "run": lambda self, inputs: fn(inputs)})
        register(function_kernel())
        return fn

    return wrap


@dataclasses.dataclass
class _Entry:
    kernel: Kernel
    source: str


_registered: list = []
_unavailable: dict = {}    # name -> reason its package did not import
_loaded_files: set = set()  # plug-in and adapter files imported
_loading_source = "<python>"


def register(k: Kernel) -> Kernel:
    """Adds a kernel instance; its name must be new."""
    if not isinstance(k, Kernel):
        raise TypeError(f"attnreplay_plugin.register: expected a Kernel instance, got {type(k).__name__}")
    _check_capabilities(k)
    if any(entry.kernel.name == k.name for entry in _registered):
        raise ValueError(f"attnreplay_plugin.register: kernel '{k.name}' is registered twice")
    _registered.append(_Entry(k, _loading_source))
    _unavailable.pop(k.name, None)
    return k


def unavailable(name: str, reason: str) -> None:
    """Says that kernel `name` cannot run here and why (its package does not import, say);
    `attnreplay kernels` lists it."""
    if not any(entry.kernel.name == name for entry in _registered):
        _unavailable[name] = reason


def optional_import(module: str, kernels: Sequence[str]):
    """The module, or None after marking `kernels` unavailable with the import error."""
    try:
        return importlib.import_module(module)
    except Exception as error:  # a broken install raises more than ImportError
        for name in kernels:
            unavailable(name, f"{module} does not import: {type(error).__name__}: {error}")
        return None


def _check_capabilities(k: Kernel) -> None:
    problems = []
    if not k.name or not isinstance(k.name, str) or any(c.isspace() or c == "," for c in k.name):
        problems.append(f"name {k.name!r} must be a non-empty word without commas")
    if k.device not in ("cpu", "cuda"):
        problems.append(f"device {k.device!r} must be 'cpu' or 'cuda'")
    if k.layout not in LAYOUTS:
        problems.append(f"layout {k.layout!r} must be one of {LAYOUTS}")
    if any(m not in MASK_KINDS for m in k.masks):
        problems.append(f"masks {tuple(k.masks)!r} must be among {MASK_KINDS}")
    if any(a not in CAUSAL_ALIGNMENTS for a in k.causal_alignments):
        problems.append(f"causal_alignments {tuple(k.causal_alignments)!r} must be among {CAUSAL_ALIGNMENTS}")
    if isinstance(k.extensions, str) or any(e not in EXTENSIONS for e in k.extensions):
        problems.append(f"extensions {k.extensions!r} must be a tuple of names among {EXTENSIONS}")
    if problems:
        raise ValueError(f"kernel {k.name!r}: " + "; ".join(problems))


# -- the host side: what attnreplay's embedded interpreter calls ------------------------------


def _load(target: str) -> list:
    """Imports a plug-in file or module, once; returns the names it registered."""
    global _loading_source
    before = len(_registered)
    if target.endswith(".py") or os.sep in target:
        path = os.path.abspath(target)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no such file")
        # An adapter that a plug-in imported first (tests/e2e/plugins/adapters_on_cpu.py) stays.
        if any(entry.source == path for entry in _registered) or path in _loaded_files:
            return [entry.kernel.name for entry in _registered if entry.source == path]
        _loaded_files.add(path)
        module_name = "attnreplay_plugin_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        # A plug-in file imports its neighbours as a script would.
        folder = os.path.dirname(path)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        _loading_source = path
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(module_name, None)
            del _registered[before:]
            raise
        finally:
            _loading_source = "<python>"
    else:
        try:
            found = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            found = None
        _loading_source = found.origin if found and found.origin else target
        try:
            importlib.import_module(target)
        except BaseException:
            del _registered[before:]
            raise
        finally:
            _loading_source = "<python>"
    return [entry.kernel.name for entry in _registered[before:]]


def _load_adapters(folder: str) -> list:
    """Imports every adapter in `folder` (one file each); returns (file, error) for those that
    failed for a reason other than their package being absent (which they report themselves)."""
    if not os.path.isdir(folder):
        return [(folder, "the adapters' folder is missing from this installation")]
    failures = []
    for file in sorted(os.listdir(folder)):
        if file.endswith(".py") and not file.startswith("_"):
            try:
                _load(os.path.join(folder, file))
            except Exception as error:
                failures.append((os.path.join(folder, file), _describe(error)[0]))
    return failures


def _entries():
    return [(e.kernel, e.source) for e in _registered]


def _unavailable_kernels():
    return sorted(_unavailable.items())


def _describe(error: BaseException, trace=None):
    """(one line for the table, the traceback for the JSON)."""
    if trace is not None and error.__traceback__ is None:
        error = error.with_traceback(trace)
    message = str(error).strip().splitlines()
    line = f"{type(error).__name__}: {message[0]}" if message else type(error).__name__
    if len(message) > 1:
        line += " ..."
    return line, "".join(traceback.format_exception(type(error), error, error.__traceback__))


def _precompile(kernel_: Kernel, fields: dict):
    """(kind, seconds) of what kernel_.precompile() compiled for a call like `fields`, or None
    where the kernel declines the call or had it compiled already."""
    spec = _make_spec(kernel_, fields)
    if kernel_.decline_reason(spec) is not None:
        return None
    start = time.perf_counter()
    kind = kernel_.precompile(spec)
    if kind is None:
        return None
    if kernel_.device == "cuda":
        import torch
        torch.cuda.synchronize()
    return str(kind), time.perf_counter() - start


def _make_spec(kernel_: Kernel, fields: dict) -> CallSpec:
    fields = dict(fields)
    fields["quant"] = QuantOptions(**fields["quant"])
    fields["layout"] = kernel_.layout
    fields["device"] = kernel_.device
    for shape in ("mask_shape", "alibi_shape", "sinks_shape"):
        if fields.get(shape) is not None:
            fields[shape] = tuple(fields[shape])
    return CallSpec(**fields)


def _same_bits(a, b) -> bool:
    """Whether two tensors hold the same values bit for bit. torch.equal compares with ==, under
    which a NaN differs from itself, and a capture may hold NaNs."""
    import torch

    if not isinstance(a, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if a.dtype.is_floating_point:
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        a, b = a.view(bits), b.view(bits)
    return torch.equal(a, b)


class _Prepared:
    """One kernel bound to one call: the inputs made once, prepare() and run() as the timer asks,
    and the checks that keep a broken plug-in from passing or from spoiling the next kernel."""

    def __init__(self, kernel_: Kernel, spec: CallSpec, q, k, v, mask, batch=None):
        import torch

        self.kernel = kernel_
        self.spec = spec
        batch = dict(batch or {})
        self.inputs = _kernel_inputs(kernel_, spec, q, k, v, mask, batch)
        q, k, v = self.inputs.q, self.inputs.k, self.inputs.v
        self._originals = {name: t.clone() for name, t in (("q", q), ("k", k), ("v", v), ("mask", mask),
                                                            *batch.items())
                           if isinstance(t, torch.Tensor)}
        self.prepared = kernel_.prepare(self.inputs)
        self.out = None
        # Compilation on first use, timed here and reported apart: never in a timing's warm-up.
        self.compile_s = 0.0
        if type(kernel_).warm_up is not Kernel.warm_up:
            start = time.perf_counter()
            compiled = kernel_.warm_up(self.prepared)
            if kernel_.device == "cuda":
                torch.cuda.synchronize()
            self.compile_s = time.perf_counter() - start if compiled is not False else 0.0

    def prepare_inputs(self):
        self.prepared = self.kernel.prepare(self.inputs)

    def run(self):
        self.out = self.kernel.run(self.prepared)

    def problem(self) -> Optional[str]:
        """Why the last output cannot be judged, or None."""
        for name, original in self._originals.items():
            current = getattr(self.inputs, name)
            if current is None or not _same_bits(current, original):
                return f"the kernel wrote into its input '{name}'"
        return _output_problem(self.kernel, self.spec, self.out)

    def restore_inputs(self):
        """Puts back inputs a kernel overwrote, so that its own later runs see the call's."""
        for name, original in self._originals.items():
            setattr(self.inputs, name, original.clone())

    def output_bhsd(self):
        return _output_bhsd(self.kernel, self.out).contiguous()


def _kernel_inputs(kernel_: Kernel, spec: CallSpec, q, k, v, mask, batch) -> "Inputs":
    """What the kernel's prepare() gets. q, k, v come as (b, h, s, d) views of the model's tensors on
    the kernel's device, or for a ragged batch as stored: rows (t, h, d), or pages (pages, page_size,
    h, d) for a kernel that reads them (the host packs a paged batch's keys for the others)."""
    heads_dim = -2 if kernel_.layout == "thd" else 1
    if not kernel_.native_gqa and spec.is_gqa:
        group = spec.heads_q // spec.heads_kv
        k = k.repeat_interleave(group, dim=heads_dim)
        v = v.repeat_interleave(group, dim=heads_dim)
    if kernel_.layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    q, k, v = (t.contiguous() for t in (q, k, v))
    return Inputs(q, k, v, mask, spec, **batch)


def _output_problem(kernel_: Kernel, spec: CallSpec, out) -> Optional[str]:
    """Why run()'s output is not one of the call's shape, dtype and device, or None."""
    import torch

    if not isinstance(out, torch.Tensor):
        return f"run() returned {type(out).__name__}, expected a torch.Tensor"
    if kernel_.layout == "thd":
        expected = (spec.seq_q, spec.heads_q, spec.head_dim_vo)
    elif kernel_.layout == "bhsd":
        expected = (spec.batch, spec.heads_q, spec.seq_q, spec.head_dim_vo)
    else:
        expected = (spec.batch, spec.seq_q, spec.heads_q, spec.head_dim_vo)
    if tuple(out.shape) != expected:
        names = {"bhsd": "batch, heads_q, seq_q, head_dim_vo", "bshd": "batch, seq_q, heads_q, head_dim_vo",
                 "thd": "total_q, heads_q, head_dim_vo"}[kernel_.layout]
        return f"run() returned shape {tuple(out.shape)}, expected {expected} ({names})"
    want_dtype = kernel_.output_dtype or spec.dtype
    if out.dtype != getattr(torch, want_dtype):
        return f"run() returned dtype {str(out.dtype).replace('torch.', '')}, expected {want_dtype}"
    if out.device.type != kernel_.device:
        return f"run() returned a tensor on {out.device}, expected {kernel_.device}"
    return None


def _output_bhsd(kernel_: Kernel, out):
    """run()'s output as (b, h, s, d), a view."""
    if kernel_.layout == "bshd":
        return out.transpose(1, 2)
    if kernel_.layout == "thd":
        return out.transpose(0, 1).unsqueeze(0)  # the packed view: one sequence of every row
    return out


def _run_resident(kernel_: Kernel, spec: CallSpec, q, k, v, mask, extension_tensors=None):
    """Kernel substitution on a job's own tensors, on their device: prepare() and run() once, and
    the output as (b, h, s, d). Unlike _Prepared, nothing here waits for the GPU (no copies of the
    inputs to check against, no compile timing): that is what keeps the job's step time its own.
    The replay is where a plug-in's writes into its inputs are caught."""
    out = kernel_.run(kernel_.prepare(_kernel_inputs(kernel_, spec, q, k, v, mask, dict(extension_tensors or {}))))
    problem = _output_problem(kernel_, spec, out)
    if problem:
        raise ValueError(problem)
    return _output_bhsd(kernel_, out)
