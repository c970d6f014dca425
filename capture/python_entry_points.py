"""Capture's Python side: attention entry points that are Python functions, not dispatcher ops.

FlashInfer's wrappers and single-request functions call their JIT modules through their own FFI,
and flash-attn 2's flash_attn_with_kvcache calls its extension directly: the dispatcher never sees
them. Capture (libattncap_torch.so) runs this module once when libtorch loads into a Python job.
It wraps those functions as their modules are imported; a wrapped function runs exactly as before,
then asks capture whether the call is recorded (attncap::select_python_call, which counts it) and,
if so, hands it over in flash-attn's names to attncap::python_call, whose kernel records it as the
dispatcher ops are recorded. Nothing here touches the call's tensors or result.

Every argument goes to the record: the ones mapped to its fields (scale, causality, window,
softcap, ALiBi, sinks, ragged offsets, pages) by name, every other as text ("arg.<name>"), which
replay judges (replay/judge/call_semantics.cpp): honoured, neutral, or refused by name.
"""
import functools
import importlib.abc
import inspect
import sys
import threading
import time
import weakref

# This runs while `import torch` loads libtorch: torch is in sys.modules, not yet initialised (its
# attributes are read at call time only). Never imported from here.
torch = sys.modules.get("torch")

QUIET = False  # capture sets it from ATTNCAP_QUIET

_local = threading.local()
_said = set()
# Per wrapper object, the arguments of its __init__ and of its last plan.
_arguments_of = weakref.WeakKeyDictionary()


def _say_once(key, text):
    if key in _said:
        return
    _said.add(key)
    if not QUIET:
        sys.stderr.write(f"[attncap] {text}\n")


_DTYPE_NAMES = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
                "int32": "Int", "int64": "Long", "uint8": "Byte", "int8": "Char", "bool": "Bool",
                "float8_e4m3fn": "Float8_e4m3fn", "float8_e5m2": "Float8_e5m2"}


def _text(value):
    """An argument as capture writes the dispatcher ops' arguments (observer.cpp)."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        return text[:-2] if text.endswith(".0") else text
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).replace("torch.", "")
        return f"tensor {_DTYPE_NAMES.get(dtype, dtype)} [{','.join(str(n) for n in value.shape)}]"
    if isinstance(value, torch.dtype):
        return str(value).replace("torch.", "")
    if isinstance(value, (tuple, list)):
        return ",".join(_text(item) for item in value)
    return str(value)


def _bound(signature, args, kwargs):
    """The call's arguments by name, defaults filled in, **kwargs spread; an empty *args left out."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(value)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            if value:
                arguments[name] = value
        elif name != "self":
            arguments[name] = value
    return arguments


def _selected(op):
    """Whether capture records this call (counting it either way). Never while torch.compile traces
    (fake tensors) or while a CUDA graph is being captured (work then would join the job's graph)."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling():
        return False
    if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
        _say_once("graph", "an attention call ran while a CUDA graph was being captured: calls inside CUDA graphs "
                           "are not recorded (their replays bypass Python and the dispatcher)")
        return False
    return torch.ops.attncap.select_python_call(op)


def _record(op, q, k, v, out, arguments, **fields):
    """Hands the selected call to capture. `fields` are attncap::python_call's named arguments;
    `arguments` every other argument of the call, by name."""
    names = sorted(arguments)
    torch.ops.attncap.python_call(op, q, k, v, out, argument_names=names,
                                  argument_values=[_text(arguments[name]) for name in names],
                                  wall_s=getattr(_local, "wall_s", 0.0), **fields)


def _observed(function, op, describe):
    """`function`, run as it is; then, outside any other observed call and when capture records it,
    describe(op, first argument, arguments, result) hands its call to capture under the name `op`.
    A failure there is said once and never reaches the job."""
    if getattr(function, "__attncap_observed__", False):
        return function
    signature = inspect.signature(function)

    @functools.wraps(function)
    def observed(*args, **kwargs):
        depth = getattr(_local, "depth", 0)
        _local.depth = depth + 1
        started = time.perf_counter()
        try:
            result = function(*args, **kwargs)
        finally:
            _local.depth = depth
        if depth == 0:
            _local.wall_s = time.perf_counter() - started
            try:
                if _selected(op):
                    describe(op, args[0] if args else None, _bound(signature, args, kwargs), result)
            except Exception as error:  # noqa: BLE001 - the job must never see capture's failure
                _say_once("failed:" + function.__qualname__,
                          f"a call of {function.__qualname__} was not captured: {type(error).__name__}: {error}")
        return result

    observed.__attncap_observed__ = True
    return observed


def _remembered(function, slot, keep_tensors=()):
    """A method whose arguments the wrapper's run needs later (__init__, plan): kept per object,
    the index tensors named in keep_tensors cloned (the job may refill its buffers after plan),
    other tensors as their text (not holding the job's memory)."""
    if getattr(function, "__attncap_observed__", False):
        return function
    signature = inspect.signature(function)

    @functools.wraps(function)
    def remembered(self, *args, **kwargs):
        result = function(self, *args, **kwargs)
        try:
            arguments = _bound(signature, (self,) + args, kwargs)
            for name, value in arguments.items():
                if isinstance(value, torch.Tensor):
                    arguments[name] = value.clone() if name in keep_tensors else _text(value)
            _arguments_of.setdefault(self, {})[slot] = arguments
        except Exception as error:  # noqa: BLE001
            _say_once("failed:" + function.__qualname__,
                      f"the arguments of {function.__qualname__} were not kept: {type(error).__name__}: {error}")
        return result

    remembered.__attncap_observed__ = True
    return remembered


def _replace(owner, name, wrap):
    """owner.name wrapped, with every alias of it in owner (begin_forward = plan) too."""
    original = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if original is None:
        return
    wrapped = wrap(original)
    for alias, value in list(vars(owner).items()):
        if value is original:
            setattr(owner, alias, wrapped)


# ---- FlashInfer (flashinfer/prefill.py, flashinfer/decode.py, flashinfer/mla) ----

def _flashinfer_kv(cache, layout):
    """A paged cache as (k, v), each (pages, page_size, heads_kv, dim): FlashInfer takes a (k, v)
    tuple or one (pages, 2, ...) tensor, in NHD or HND."""
    k, v = cache if isinstance(cache, (tuple, list)) else (cache[:, 0], cache[:, 1])
    return (k.transpose(1, 2), v.transpose(1, 2)) if layout == "HND" else (k, v)


def _scale(value):
    return None if value is None else float(value)


def _output(result):
    return result[0] if isinstance(result, (tuple, list)) else result


def _offsets(lengths):
    """cu_seqlens of sequences of these lengths (on the CPU: capture only copies them)."""
    return torch.tensor([0] + list(lengths), dtype=torch.int32).cumsum(0, dtype=torch.int32)


def _window_and_softcap(plan, run):
    """The window (run's window_left overrides plan's) and softcap, in flash-attn's names."""
    planned = plan.pop("window_left", -1)
    window_left = run.pop("window_left", None)
    if window_left is None:
        window_left = planned
    window_right = plan.pop("window_right", -1)
    return dict(window_size_left=-1 if window_left is None else int(window_left),
                window_size_right=-1 if window_right is None else int(window_right),
                softcap=float(plan.pop("logits_soft_cap", None) or 0.0))


def _init_and_plan(wrapper):
    """Copies of the arguments the wrapper's __init__ and last plan were given."""
    kept = _arguments_of.get(wrapper, {})
    if "plan" not in kept:
        raise RuntimeError("run() without a plan() seen by capture")
    return dict(kept.get("init", {})), dict(kept["plan"])


def _wrapper_run(decode=False):
    """describe() of a wrapper's run: its arguments with those of its __init__ and last plan."""

    def describe(op, wrapper, run, result):
        q = run.pop("q")
        init, plan = _init_and_plan(wrapper)
        layout = init.pop("kv_layout", "NHD")
        fields = _window_and_softcap(plan, run)
        fields["softmax_scale"] = _scale(plan.pop("sm_scale", None))
        fields["sinks"] = run.pop("sinks", None)
        if "paged_kv_cache" in run:
            k, v = _flashinfer_kv(run.pop("paged_kv_cache"), layout)
            # Decode's plan names them indptr, indices, last_page_len.
            for name in ("paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len"):
                fields[name] = plan.pop(name) if name in plan else plan.pop(name.replace("paged_kv_", ""))
        else:
            k, v = run.pop("k"), run.pop("v")
            if layout == "HND":
                k, v = k.transpose(0, 1), v.transpose(0, 1)
            fields["cu_seqlens_k"] = plan.pop("kv_indptr")
        if decode:
            batch = fields["paged_kv_indptr"].numel() - 1
            per_request = run.get("q_len_per_req") or plan.get("q_len_per_req") or 1
            fields["cu_seqlens_q"] = _offsets([per_request] * batch)
            fields["causal"] = False
            if per_request == 1:
                # One query a sequence sits at its last key: a right window bounds nothing.
                fields["window_size_right"] = -1
        else:
            fields["cu_seqlens_q"] = plan.pop("qo_indptr")
            fields["causal"] = bool(plan.pop("causal", False))
        run.pop("out", None)
        # run's None means plan's value (q_len_per_req): it must not hide what plan was given.
        overrides = {name: value for name, value in run.items() if value is not None or name not in plan}
        _record(op, q, k, v, _output(result), {**init, **plan, **overrides}, **fields)

    return describe


def _flashinfer_single(decode):
    def describe(op, _, call, result):
        q, k, v = call.pop("q"), call.pop("k"), call.pop("v")
        out = _output(result)
        if call.pop("kv_layout", "NHD") == "HND":
            k, v = k.transpose(0, 1), v.transpose(0, 1)
        if decode:  # q (heads, dim): one query row
            q, out = q.unsqueeze(0), out.unsqueeze(0)
        fields = _window_and_softcap(call, call)
        fields.update(softmax_scale=_scale(call.pop("sm_scale", None)), causal=bool(call.pop("causal", False)),
                      cu_seqlens_q=_offsets([q.shape[0]]), cu_seqlens_k=_offsets([k.shape[0]]))
        if decode:
            fields["window_size_right"] = -1
        _record(op, q, k, v, out, call, **fields)

    return describe


def _flashinfer_mla_run(op, wrapper, run, result):
    """BatchMLAPagedAttentionWrapper.run: DeepSeek's MLA with its matrices absorbed is attention of
    the queries [q_nope, q_pe] over one key head [ckv, kpe] and one value head ckv, paged: recorded
    so, with only the pages the call reads (the cache is a server's whole pool)."""
    init, plan = _init_and_plan(wrapper)
    for name in ("qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr"):
        init.pop(name, None)  # CUDA-graph buffers that plan fills with what it was given
    q_nope, q_pe, ckv, kpe = (run.pop(name) for name in ("q_nope", "q_pe", "ckv_cache", "kpe_cache"))
    device = q_nope.device
    indptr = plan.pop("kv_indptr").to(device, torch.long)
    listed = plan.pop("kv_indices").to(device, torch.long)[:int(indptr[-1])]
    pages, renumbered = torch.unique(listed, return_inverse=True)
    counts = indptr[1:] - indptr[:-1]
    lengths = plan.pop("kv_len_arr").to(device, torch.long)
    last = torch.where(counts > 0, lengths - (counts - 1) * ckv.shape[1], torch.zeros_like(counts))
    q = torch.cat([q_nope, q_pe], dim=-1)
    k = torch.cat([ckv[pages], kpe[pages]], dim=-1).unsqueeze(2)
    v = ckv[pages].unsqueeze(2)
    fields = dict(softmax_scale=_scale(plan.pop("sm_scale", None)), causal=bool(plan.pop("causal", False)),
                  cu_seqlens_q=plan.pop("qo_indptr"), paged_kv_indptr=indptr.to(torch.int32),
                  paged_kv_indices=renumbered.to(torch.int32), paged_kv_last_page_len=last.to(torch.int32))
    run.pop("out", None)
    _record(op, q, k, v, _output(result), {**init, **plan, **run}, **fields)


_FLASHINFER_PLAN_INDICES = ("qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len",
                            "kv_indptr", "indptr", "indices", "last_page_len", "kv_indices", "kv_len_arr")


def _wrap_flashinfer_class(module, name, describe):
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        return
    _replace(cls, "__init__", lambda f: _remembered(f, "init"))
    # Recent versions take plan's optional arguments as **kwargs and pass them on by name.
    plan = "_plan_impl" if "_plan_impl" in vars(cls) else "plan"
    _replace(cls, plan, lambda f: _remembered(f, "plan", _FLASHINFER_PLAN_INDICES))
    _replace(cls, "run", lambda f: _observed(f, f"flashinfer::{name}.run", describe))


def _wrap_flashinfer_function(module, name, describe):
    _replace(module, name, lambda f: _observed(f, f"flashinfer::{name}", describe))


def _wrap_flashinfer_prefill(module):
    _wrap_flashinfer_class(module, "BatchPrefillWithPagedKVCacheWrapper", _wrapper_run())
    _wrap_flashinfer_class(module, "BatchPrefillWithRaggedKVCacheWrapper", _wrapper_run())
    _wrap_flashinfer_function(module, "single_prefill_with_kv_cache", _flashinfer_single(decode=False))


def _wrap_flashinfer_decode(module):
    _wrap_flashinfer_class(module, "BatchDecodeWithPagedKVCacheWrapper", _wrapper_run(decode=True))
    _wrap_flashinfer_function(module, "single_decode_with_kv_cache", _flashinfer_single(decode=True))


def _wrap_flashinfer_mla(module):
    _wrap_flashinfer_class(module, "BatchMLAPagedAttentionWrapper", _flashinfer_mla_run)


# ---- flash-attn 2 (flash_attn/flash_attn_interface.py) ----

def _flash_attn_with_kvcache(op, _, call, result):
    """q (batch, s_q, heads, dim) over a cache, dense (batch, s_cache, heads_kv, dim) or paged
    (blocks, block_size, heads_kv, dim) with block_table. Keys k and v given are written into the
    cache at cache_seqlens before attention: the cache holds them once the call has run, so the
    record reads them there, with seqused_k counting them."""
    q, k_cache, v_cache = call.pop("q"), call.pop("k_cache"), call.pop("v_cache")
    batch = q.shape[0]
    lengths = call.pop("cache_seqlens", None)
    if lengths is None:
        lengths = torch.full((batch,), k_cache.shape[1], dtype=torch.int32, device=q.device)
    elif isinstance(lengths, int):
        lengths = torch.full((batch,), lengths, dtype=torch.int32, device=q.device)
    appended_k, appended_v = call.pop("k", None), call.pop("v", None)
    if appended_k is not None:
        lengths = lengths + appended_k.shape[1]
    call["k_appended"], call["v_appended"] = appended_k, appended_v
    left, right = call.pop("window_size", (-1, -1))
    _record(op, q, k_cache, v_cache, _output(result), call,
            seqused_k=lengths.to(torch.int32), block_table=call.pop("block_table", None),
            softmax_scale=_scale(call.pop("softmax_scale", None)), causal=bool(call.pop("causal", False)),
            window_size_left=int(left), window_size_right=int(right), softcap=float(call.pop("softcap", 0.0) or 0.0),
            alibi_slopes=call.pop("alibi_slopes", None))


def _wrap_flash_attn(module):
    _replace(module, "flash_attn_with_kvcache",
             lambda f: _observed(f, "flash_attn::flash_attn_with_kvcache", _flash_attn_with_kvcache))
    # flash_attn/__init__.py re-exports it: the package may already hold the original.
    package = sys.modules.get(module.__name__.rpartition(".")[0])
    if package is not None and getattr(package, "flash_attn_with_kvcache", None) is not None:
        package.flash_attn_with_kvcache = module.flash_attn_with_kvcache


WATCHED = {
    "flashinfer.prefill": _wrap_flashinfer_prefill,
    "flashinfer.decode": _wrap_flashinfer_decode,
    # The MLA wrapper's module: flashinfer/mla/_core.py, earlier flashinfer/mla.py.
    "flashinfer.mla._core": _wrap_flashinfer_mla,
    "flashinfer.mla": _wrap_flashinfer_mla,
    "flash_attn.flash_attn_interface": _wrap_flash_attn,
}


def _wrap(name, module):
    try:
        WATCHED[name](module)
    except Exception as error:  # noqa: BLE001
        _say_once("wrap:" + name, f"{name}'s attention calls are not observed: {type(error).__name__}: {error}")


class _WrappingLoader(importlib.abc.Loader):
    """The module's own loader, which then wraps what the module defined."""

    def __init__(self, loader, name):
        self._loader, self._name = loader, name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # The module keeps its own loader, as if nothing came between.
        module.__loader__ = module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _wrap(self._name, module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched module, the spec the other finders give, with its loader
    wrapped."""

    def find_spec(self, name, path=None, target=None):
        if name not in WATCHED or getattr(_local, "finding", False):
            return None
        _local.finding = True
        try:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            _local.finding = False
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _WrappingLoader(spec.loader, name)
        return spec


def install():
    if torch is None:
        raise RuntimeError("libtorch was loaded before the torch package was imported")
    for name in WATCHED:
        module = sys.modules.get(name)
        spec = getattr(module, "__spec__", None)
        if module is None:
            continue
        if spec is not None and getattr(spec, "_initializing", False):
            _say_once("early:" + name, f"{name} imported torch while it was itself being imported: its attention "
                                       f"calls are not observed (import torch first)")
        else:
            _wrap(name, module)
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
