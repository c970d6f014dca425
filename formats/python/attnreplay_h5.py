"""Read and write attnreplay's HDF5 capture files (schema v2; v1 is read too) from Python with h5py and numpy.

The schema is described in docs/format.md. In short: root attributes name the schema; the
compound dataset /calls has one row per call, /tensors one row per tensor, /metadata_json holds
each call's metadata as JSON bytes, and /data/<dtype> holds every tensor's elements, flattened
and concatenated, for each dtype. bfloat16 and float8 have no numpy type, so they are stored as
their raw bit patterns (uint16, uint8).

Reading::

    import attnreplay_h5
    calls = attnreplay_h5.read_calls("run.h5")             # numpy arrays
    calls[0]["q"]            # values, exactly: bf16 and fp8 widened to float32, fp16 as float16
    calls[0]["dtypes"]["q"]  # "bfloat16": the dtype the model's tensor had
    calls[0]["bits"]["q"]    # the stored array: bf16 as uint16 bit patterns, fp8 as uint8

    calls = attnreplay_h5.read_calls("run.h5", as_torch=True)  # torch tensors, exact dtype
    torch.save(calls[0], "call0.pt")                           # a valid attnreplay .pt call

Writing::

    attnreplay_h5.write_calls("mine.h5", [{"q": q, "k": k, "v": v, "is_causal": True}])

Tensors given to write_calls may be torch tensors (any dtype attnreplay knows) or numpy arrays.
A numpy array stands for the dtype in the call's "dtypes" entry when there is one, else for its
own dtype; bf16/fp8 can be given as their bit patterns (uint16/uint8) or as floats that the
dtype represents exactly (what read_calls returns), so write_calls(read_calls(p)) round-trips.

Only h5py and numpy are needed; torch is imported only for as_torch=True and torch inputs.
The writer does not use SWMR: it writes the whole file and closes it. Files from the C++ writer
that was killed mid-run are opened in SWMR-read mode automatically (see docs/format.md).
"""

from __future__ import annotations

import json
import math
import os
import struct
from datetime import datetime, timezone
from typing import Any, Iterable

import h5py
import numpy as np

__all__ = [
    "SCHEMA_NAME", "SCHEMA_VERSION", "DTYPES", "TENSOR_NAMES", "read_calls", "write_calls",
    "decode", "encode", "content_hash", "CaptureFormatError",
]

SCHEMA_NAME = "attnreplay.capture"
SCHEMA_VERSION = 2
MAX_RANK = 8
NAME_SIZE = 16  # bytes of the short fixed-length string fields
OP_SIZE = 128   # bytes of 'op' and 'backend'
TENSOR_NAMES = ("q", "k", "v", "mask", "out", "alibi_slopes", "sinks", "cu_seqlens_q", "cu_seqlens_k", "seqused_k",
                "block_table")
LAYOUTS = ("bhsd", "bshd", "thd")

# dtype name (torch's spelling) -> numpy type of its /data/<dtype> dataset.
DTYPES: dict[str, np.dtype] = {
    "float64": np.dtype("<f8"),
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype("<u2"),       # bit patterns
    "float8_e4m3fn": np.dtype("u1"),   # bit patterns
    "float8_e5m2": np.dtype("u1"),     # bit patterns
    "int64": np.dtype("<i8"),
    "int32": np.dtype("<i4"),
    "int8": np.dtype("i1"),
    "uint8": np.dtype("u1"),
    "bool": np.dtype("u1"),            # 0 or 1
}
_BIT_PATTERN_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2")

# The 'storage' attribute of each /data/<dtype> dataset: how to turn the stored array back.
_STORAGE_NOTES = {
    "bfloat16": "bfloat16 bit patterns in uint16; float32 = (x.astype('<u4') << 16).view('<f4')",
    "float8_e4m3fn": "float8_e4m3fn bit patterns in uint8; torch.from_numpy(x).view(torch.float8_e4m3fn)",
    "float8_e5m2": "float8_e5m2 bit patterns in uint8; torch.from_numpy(x).view(torch.float8_e5m2)",
    "bool": "bool as uint8 (0 or 1)",
}

# numpy dtype -> dtype name, for arrays given without a "dtypes" entry.
_NUMPY_NAMES = {
    np.dtype("float64"): "float64", np.dtype("float32"): "float32", np.dtype("float16"): "float16",
    np.dtype("int64"): "int64", np.dtype("int32"): "int32", np.dtype("int8"): "int8",
    np.dtype("uint8"): "uint8", np.dtype("bool"): "bool",
}

_CALL_ROW = np.dtype([
    ("call_index", "<i8"),
    ("op", f"S{OP_SIZE}"),
    ("backend", f"S{OP_SIZE}"),
    ("layout", f"S{NAME_SIZE}"),
    ("is_causal", "u1"),
    ("causal_alignment", f"S{NAME_SIZE}"),
    ("scale", "<f8"),           # NaN: the default 1/sqrt(head_dim_qk)
    ("dropout_p", "<f8"),
    ("enable_gqa", "u1"),
    ("first_tensor", "<i8"),
    ("tensor_count", "<i4"),
    ("metadata_offset", "<i8"),
    ("metadata_nbytes", "<i8"),
    # v2; a v1 file has none of them (window unbounded, no softcap).
    ("window_left", "<i8"),     # -1: unbounded
    ("window_right", "<i8"),    # -1: unbounded
    ("softcap", "<f8"),         # 0: none
])

_TENSOR_ROW = np.dtype([
    ("call_index", "<i8"),
    ("name", f"S{NAME_SIZE}"),
    ("dtype", f"S{NAME_SIZE}"),
    ("ndim", "<i4"),
    ("shape", "<i8", (MAX_RANK,)),
    ("strides", "<i8", (MAX_RANK,)),   # element strides of the model's tensor
    ("device", f"S{NAME_SIZE}"),
    ("offset", "<i8"),                  # first element in /data/<dtype>
    ("numel", "<i8"),
    ("content_hash", "<u8"),
])


class CaptureFormatError(ValueError):
    """A file that is not a readable attnreplay capture; the message names file, call and field."""


# ---------------------------------------------------------------------------------------------
# Element conversions


def _minifloat_table(exponent_bits: int, mantissa_bits: int, bias: int, has_inf: bool) -> np.ndarray:
    """float32 value of each of the 256 8-bit patterns of a float8 format."""
    values = np.empty(256, dtype=np.float32)
    exponent_mask = (1 << exponent_bits) - 1
    mantissa_mask = (1 << mantissa_bits) - 1
    for bits in range(256):
        sign = -1.0 if bits & 0x80 else 1.0
        exponent = (bits >> mantissa_bits) & exponent_mask
        mantissa = bits & mantissa_mask
        if has_inf and exponent == exponent_mask:  # e5m2: IEEE-style inf and NaN
            value = math.inf if mantissa == 0 else math.nan
        elif not has_inf and exponent == exponent_mask and mantissa == mantissa_mask:  # e4m3fn: NaN only
            value = math.nan
        elif exponent == 0:
            value = math.ldexp(mantissa, 1 - bias - mantissa_bits)
        else:
            value = math.ldexp(mantissa | (1 << mantissa_bits), exponent - bias - mantissa_bits)
        values[bits] = math.copysign(value, sign)  # keeps the sign of zeros and NaNs
    return values


_FLOAT8_TABLES = {
    "float8_e4m3fn": _minifloat_table(4, 3, 7, has_inf=False),
    "float8_e5m2": _minifloat_table(5, 2, 15, has_inf=True),
}


def decode(stored: np.ndarray, dtype: str) -> np.ndarray:
    """The values of a stored /data array, exactly: bf16 and fp8 as float32, bool as bool."""
    stored = np.asarray(stored)
    if dtype == "bfloat16":
        return (stored.astype("<u4") << 16).view("<f4")
    if dtype in _FLOAT8_TABLES:
        return _FLOAT8_TABLES[dtype][stored.astype(np.intp)]
    if dtype == "bool":
        return stored != 0
    return stored.astype(DTYPES[dtype], copy=False)


def encode(values: np.ndarray, dtype: str) -> np.ndarray:
    """The stored form of `values` for `dtype`; bf16/fp8 values must be exactly representable.

    Already-stored bit patterns (uint16 for bf16, uint8 for fp8) pass through unchanged.
    """
    values = np.asarray(values)
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype '{dtype}' (known: {', '.join(DTYPES)})")
    if dtype == "bfloat16":
        if values.dtype in (np.uint16, np.int16):
            return values.view("<u2")
        as_f32 = values.astype("<f4")
        bits = (as_f32.view("<u4") >> 16).astype("<u2")
        if not np.array_equal(decode(bits, dtype), as_f32, equal_nan=True) or not np.array_equal(
                as_f32, values, equal_nan=True):
            raise ValueError("bfloat16: values are not exactly representable; pass torch tensors or uint16 bits")
        return bits
    if dtype in _FLOAT8_TABLES:
        if values.dtype in (np.uint8, np.int8):
            return values.view("u1")
        table = _FLOAT8_TABLES[dtype]
        as_f32 = values.astype("<f4").ravel()
        finite = table[np.isfinite(table)]
        patterns = np.nonzero(np.isfinite(table))[0].astype("u1")
        order = np.argsort(finite, kind="stable")
        position = np.clip(np.searchsorted(finite[order], as_f32), 0, len(finite) - 1)
        bits = patterns[order][position]
        # -0.0 and 0.0 compare equal; keep the sign bit as given.
        bits = np.where(np.signbit(as_f32) & (as_f32 == 0), np.uint8(0x80), bits).astype("u1")
        nan_patterns = np.where(np.signbit(as_f32), np.uint8(0xFF), np.uint8(0x7F))
        bits = np.where(np.isnan(as_f32), nan_patterns, bits).astype("u1")
        if dtype == "float8_e5m2":
            bits = np.where(np.isposinf(as_f32), np.uint8(0x7C), bits)
            bits = np.where(np.isneginf(as_f32), np.uint8(0xFC), bits).astype("u1")
        if not np.array_equal(decode(bits, dtype), as_f32, equal_nan=True) or not np.array_equal(
                as_f32, values.ravel(), equal_nan=True):
            raise ValueError(f"{dtype}: values are not exactly representable; pass torch tensors or uint8 bits")
        return bits.reshape(values.shape)
    if dtype == "bool":
        return values.astype(bool).astype("u1")
    converted = values.astype(DTYPES[dtype])
    if not np.array_equal(converted, values, equal_nan=True):
        raise ValueError(f"{dtype}: values of type {values.dtype} do not convert exactly")
    return converted


# ---------------------------------------------------------------------------------------------
# content_hash: the same 64-bit hash as formats/content_hash.cpp (informational; readers do not
# check it, the C++ writer uses it to store repeated tensors once).

_U64 = (1 << 64) - 1


def _mix(value: int) -> int:
    value ^= value >> 30
    value = (value * 0xBF58476D1CE4E5B9) & _U64
    value ^= value >> 27
    value = (value * 0x94D049BB133111EB) & _U64
    value ^= value >> 31
    return value


def _mix_array(value: np.ndarray) -> np.ndarray:
    value = value ^ (value >> np.uint64(30))
    value = value * np.uint64(0xBF58476D1CE4E5B9)
    value = value ^ (value >> np.uint64(27))
    value = value * np.uint64(0x94D049BB133111EB)
    return value ^ (value >> np.uint64(31))


def content_hash(data: bytes | np.ndarray) -> int:
    """The hash of a tensor's bytes (C order, little-endian) that the 'content_hash' field holds."""
    raw = np.ascontiguousarray(data).view(np.uint8).ravel() if isinstance(data, np.ndarray) else \
        np.frombuffer(data, dtype=np.uint8)
    size = raw.size
    blocks = size // 32
    lanes = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x27D4EB2F165667C5],
                     dtype=np.uint64)
    if blocks:
        words = raw[:blocks * 32].view("<u8").reshape(blocks, 4)
        with np.errstate(over="ignore"):
            for row in words:
                lanes = _mix_array(lanes ^ row) + row
    hash_value = _mix(size)
    tail = 0
    for byte in raw[blocks * 32:].tolist():
        tail = ((tail << 8) | byte) & _U64
        hash_value = _mix(hash_value ^ tail)
    for lane in lanes.tolist():
        hash_value = (_mix(hash_value ^ lane) + lane) & _U64
    return hash_value


# ---------------------------------------------------------------------------------------------
# Reading


def _text(value: bytes | str) -> str:
    if isinstance(value, bytes):
        return value.split(b"\0", 1)[0].decode("utf-8", errors="replace")
    return str(value)


_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _check_not_truncated(path: str) -> None:
    """Raises when the file is shorter than its superblock's end-of-file address.

    HDF5 makes this check itself, except when a file is opened for SWMR reading, which a file
    left by a killed SWMR writer needs; without it the missing bytes would read as zeros.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        base = 0
        while base <= min(size, 1 << 20):
            f.seek(base)
            head = f.read(48)
            if head[:8] == _SIGNATURE:
                break
            base = 512 if base == 0 else base * 2
        else:
            return
    version = head[8]
    if version not in (2, 3) or head[9] != 8:
        return  # the older superblocks are never written in SWMR mode
    _, _, end_of_file, _ = struct.unpack_from("<4Q", head, 12)
    if size < base + end_of_file:
        raise CaptureFormatError(f"{path}: truncated: {size} bytes, but the HDF5 superblock says "
                                 f"{base + end_of_file}")


def _open(path: str) -> h5py.File:
    if not os.path.isfile(path):
        raise CaptureFormatError(f"{path}: no such file")
    try:
        return h5py.File(path, "r")
    except (OSError, RuntimeError) as first_error:
        # A writer that was killed leaves the SWMR-writing flag set; SWMR readers ignore it.
        try:
            f = h5py.File(path, "r", swmr=True)
        except (OSError, RuntimeError):
            raise CaptureFormatError(f"{path}: cannot be read as HDF5 (truncated or corrupt?): {first_error}") \
                from first_error
        try:
            _check_not_truncated(path)
        except CaptureFormatError:
            f.close()
            raise
        return f


def _torch_tensor(stored: np.ndarray, dtype: str):
    import torch

    stored = np.ascontiguousarray(stored)
    if dtype == "bfloat16":
        return torch.from_numpy(stored.view("<i2").copy()).view(torch.bfloat16)
    if dtype in _FLOAT8_TABLES:
        return torch.from_numpy(stored.copy()).view(getattr(torch, dtype))
    if dtype == "bool":
        return torch.from_numpy(stored != 0)
    return torch.from_numpy(stored.astype(DTYPES[dtype], copy=True))


def read_calls(path: str, *, as_torch: bool = False) -> list[dict[str, Any]]:
    """Every call of an HDF5 capture, in file order, as a list of dicts.

    Each dict has the keys of attnreplay's .pt call schema (docs/format.md):
    format, schema_version, call_index, op, backend, layout ("bhsd"/"bshd"/"thd"), is_causal,
    causal_alignment ("top_left"/"bottom_right"), scale (None: 1/sqrt(head_dim_qk)), dropout_p,
    enable_gqa, window_left and window_right (None: unbounded), softcap (0: none), metadata (dict),
    q, k, v, mask, out, alibi_slopes, sinks, and a ragged (thd) call's cu_seqlens_q, cu_seqlens_k,
    seqused_k and block_table (None when absent), devices
    ({tensor name: device}); and also dtypes ({tensor name: dtype name}) and strides
    ({tensor name: tuple of the model's element strides}).

    Tensors are numpy arrays holding the exact values (bf16 and fp8 as float32, bool as bool),
    with a further key bits ({tensor name: the stored array, shaped}: bf16 as uint16, fp8 as
    uint8 bit patterns); with as_torch=True they are torch tensors of the exact dtype, and the
    dict can be given to torch.save as an attnreplay .pt call.

    Raises CaptureFormatError naming the file (and call and field) for anything malformed.
    """
    with _open(path) as f:
        schema = f.attrs.get("attnreplay_schema")
        if schema is None or _text(schema if not isinstance(schema, np.ndarray) else schema.item()) != SCHEMA_NAME:
            raise CaptureFormatError(f"{path}: not an attnreplay capture: root attribute 'attnreplay_schema' is "
                                     f"{'missing' if schema is None else repr(_text(schema))}")
        version = f.attrs.get("schema_version")
        if version is None:
            raise CaptureFormatError(f"{path}: root attribute 'schema_version' is missing")
        if not 1 <= int(version) <= SCHEMA_VERSION:
            raise CaptureFormatError(f"{path}: schema_version {int(version)} is not readable (reads 1..{SCHEMA_VERSION})")
        for name in ("calls", "tensors", "metadata_json"):
            if name not in f:
                raise CaptureFormatError(f"{path}: dataset '/{name}' is missing")
        calls = f["calls"][()]
        tensors = f["tensors"][()]
        metadata_bytes = f["metadata_json"][()].tobytes()
        stored_cache: dict[str, np.ndarray] = {}

        def stored_data(dtype: str, where: str) -> np.ndarray:
            if dtype not in stored_cache:
                if f"data/{dtype}" not in f:
                    raise CaptureFormatError(f"{where}: dataset '/data/{dtype}' is missing")
                stored_cache[dtype] = f[f"data/{dtype}"]
            return stored_cache[dtype]

        result = []
        for row in calls:
            call_index = int(row["call_index"])
            where = f"{path}: call {call_index}"
            call: dict[str, Any] = {
                "format": "attnreplay.call",
                "schema_version": 2,
                "call_index": call_index,
                "op": _text(row["op"]),
                "backend": _text(row["backend"]),
                "layout": _text(row["layout"]).lower(),
                "is_causal": bool(row["is_causal"]),
                "causal_alignment": _text(row["causal_alignment"]),
                "scale": None if math.isnan(float(row["scale"])) else float(row["scale"]),
                "dropout_p": float(row["dropout_p"]),
                "enable_gqa": bool(row["enable_gqa"]),
                "window_left": None, "window_right": None, "softcap": 0.0,
                "metadata": {},
            }
            if "softcap" in calls.dtype.names:  # schema v2
                for side in ("window_left", "window_right"):
                    call[side] = int(row[side]) if int(row[side]) >= 0 else None
                call["softcap"] = float(row["softcap"])
            if call["layout"] not in LAYOUTS:
                raise CaptureFormatError(f"{where}: field 'layout': expected bhsd, bshd or thd, got '{call['layout']}'")
            if call["causal_alignment"] not in ("top_left", "bottom_right"):
                raise CaptureFormatError(f"{where}: field 'causal_alignment': expected top_left or bottom_right, "
                                         f"got '{call['causal_alignment']}'")
            offset, nbytes = int(row["metadata_offset"]), int(row["metadata_nbytes"])
            if nbytes:
                if offset < 0 or nbytes < 0 or offset + nbytes > len(metadata_bytes):
                    raise CaptureFormatError(f"{where}: field 'metadata': bytes [{offset}, {offset + nbytes}) lie "
                                             f"beyond '/metadata_json' ({len(metadata_bytes)} bytes)")
                text = metadata_bytes[offset:offset + nbytes].decode("utf-8", errors="replace")
                try:
                    metadata = json.loads(text)
                except ValueError:
                    metadata = None
                if not isinstance(metadata, dict):
                    raise CaptureFormatError(f"{where}: field 'metadata': expected a JSON object, got '{text}'")
                # A name too long for its fixed-length field is kept whole in the metadata; only
                # then (field full, and the whole name starts with it) does the key replace it.
                for key in ("op", "backend"):
                    whole = metadata.get(key)
                    field = bytes(row[key]).split(b"\0", 1)[0]
                    if isinstance(whole, str) and len(field) == OP_SIZE and \
                            whole.encode("utf-8").startswith(field):
                        call[key] = metadata.pop(key)
                call["metadata"] = metadata

            first, count = int(row["first_tensor"]), int(row["tensor_count"])
            if first < 0 or count < 0 or first + count > len(tensors):
                raise CaptureFormatError(f"{where}: field 'tensors': rows [{first}, {first + count}) lie beyond the "
                                         f"'tensors' table ({len(tensors)} rows)")
            call.update({name: None for name in TENSOR_NAMES})
            dtypes, strides, devices, bits = {}, {}, {}, {}
            for position in range(first, first + count):
                t = tensors[position]
                name = _text(t["name"])
                if name not in TENSOR_NAMES:
                    raise CaptureFormatError(f"{where}: field '{name}': unknown tensor name (expected "
                                             f"{', '.join(TENSOR_NAMES)})")
                if int(t["call_index"]) != call_index:
                    raise CaptureFormatError(f"{where}: field '{name}': tensor row {position} belongs to call "
                                             f"{int(t['call_index'])}")
                dtype = _text(t["dtype"])
                if dtype not in DTYPES:
                    raise CaptureFormatError(f"{where}: field '{name}': unknown dtype '{dtype}'")
                ndim = int(t["ndim"])
                if not 0 <= ndim <= MAX_RANK:
                    raise CaptureFormatError(f"{where}: field '{name}': ndim {ndim} out of range")
                shape = tuple(int(d) for d in t["shape"][:ndim])
                if any(d < 0 for d in shape):
                    raise CaptureFormatError(f"{where}: field '{name}': negative dim in {shape}")
                numel, start = int(t["numel"]), int(t["offset"])
                if math.prod(shape) != numel:
                    raise CaptureFormatError(f"{where}: field '{name}': shape {shape} has {math.prod(shape)} "
                                             f"elements, but numel says {numel}")
                data = stored_data(dtype, where)
                if start < 0 or start + numel > data.shape[0]:
                    raise CaptureFormatError(f"{where}: field '{name}': elements [{start}, {start + numel}) lie beyond "
                                             f"'/data/{dtype}' ({data.shape[0]} elements); the file was cut short")
                stored = np.asarray(data[start:start + numel]).reshape(shape)
                dtypes[name] = dtype
                strides[name] = tuple(int(s) for s in t["strides"][:ndim])
                devices[name] = _text(t["device"])
                if as_torch:
                    call[name] = _torch_tensor(stored, dtype)
                else:
                    bits[name] = stored
                    call[name] = decode(stored, dtype)
            for name in ("q", "k", "v"):
                if call[name] is None:
                    raise CaptureFormatError(f"{where}: field '{name}': missing")
            call["dtypes"], call["strides"], call["devices"] = dtypes, strides, devices
            if not as_torch:
                call["bits"] = bits
            result.append(call)
        return result


# ---------------------------------------------------------------------------------------------
# Writing


_ALIASES = {"q": ("q", "query"), "k": ("k", "key"), "v": ("v", "value"), "mask": ("mask", "attn_mask"),
            "out": ("out", "output"), **{name: (name,) for name in TENSOR_NAMES[5:]}}


def _tensor_of(call: dict, name: str):
    for key in _ALIASES[name]:
        if call.get(key) is not None:
            return call[key]
    return None


def _fixed(text: str, size: int, where: str, field: str) -> bytes:
    encoded = text.encode("utf-8")
    if len(encoded) > size:
        raise ValueError(f"{where}: field '{field}': '{text}' is longer than {size} bytes")
    return encoded


def _stored_form(tensor, declared: str | None, where: str, name: str):
    """(dtype name, stored C-order numpy array, element strides, device) of a tensor."""
    if type(tensor).__module__.startswith("torch"):
        import torch

        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise ValueError(f"{where}: field '{name}': dtype {tensor.dtype} is not supported")
        device = str(tensor.device)
        strides = tuple(tensor.stride())
        contiguous = tensor.detach().cpu().contiguous()
        if dtype == "bfloat16":
            stored = contiguous.view(torch.int16).numpy().view("<u2")
        elif dtype in _FLOAT8_TABLES:
            stored = contiguous.view(torch.uint8).numpy()
        else:
            stored = contiguous.numpy().astype(DTYPES[dtype])
        return dtype, np.ascontiguousarray(stored), strides, device
    array = np.asarray(tensor)
    dtype = declared or _NUMPY_NAMES.get(array.dtype)
    if dtype is None:
        raise ValueError(f"{where}: field '{name}': numpy dtype {array.dtype} has no attnreplay dtype; "
                         f"give one in the call's 'dtypes'")
    if array.itemsize and all(s >= 0 and s % array.itemsize == 0 for s in array.strides):
        strides = tuple(s // array.itemsize for s in array.strides)  # a view keeps its strides
    else:
        strides = _contiguous_strides(array.shape)
    try:
        stored = encode(array, dtype)
    except ValueError as error:
        raise ValueError(f"{where}: field '{name}': {error}") from None
    return dtype, np.ascontiguousarray(stored), strides, "cpu"


def _contiguous_strides(shape) -> tuple:
    strides, running = [], 1
    for dim in reversed(shape):
        strides.append(running)
        running *= dim
    return tuple(reversed(strides))


def _appendable(parent, name: str, dtype, chunk: int, data=None):
    data = np.zeros(0, dtype=dtype) if data is None else data
    return parent.create_dataset(name, data=data, maxshape=(None,), chunks=(max(1, chunk),), dtype=dtype)


def write_calls(path: str, calls: Iterable[dict[str, Any]], *, producer: str = "attnreplay_h5.py",
                deduplicate: bool = True) -> int:
    """Writes `calls` to a new HDF5 capture at `path` (overwritten); returns the number of calls.

    Each call is a dict with the keys read_calls returns; only q, k and v are required
    ("query"/"key"/"value", "attn_mask" and "output" are accepted too). Defaults: call_index =
    position, op = backend = "", layout "bhsd", is_causal False, causal_alignment "top_left",
    scale None (1/sqrt(head_dim_qk)), dropout_p 0, enable_gqa False, window_left and window_right
    None (unbounded), softcap 0, metadata {}.
    Optional "dtypes", "strides" and "devices" dicts override what the tensors say.
    With `deduplicate`, a tensor whose bytes were already written points at the first copy.
    """
    call_rows, tensor_rows, metadata = [], [], bytearray()
    stored: dict[str, list[np.ndarray]] = {dtype: [] for dtype in DTYPES}
    lengths = {dtype: 0 for dtype in DTYPES}
    written: dict[tuple, list[tuple[int, np.ndarray]]] = {}
    for position, call in enumerate(calls):
        call_index = int(call.get("call_index", position))
        where = f"{path}: call {call_index}"
        declared_dtypes = call.get("dtypes") or {}
        first_tensor = len(tensor_rows)
        for name in TENSOR_NAMES:
            tensor = _tensor_of(call, name)
            if tensor is None:
                if name in ("q", "k", "v"):
                    raise ValueError(f"{where}: field '{name}': missing")
                continue
            dtype, data, strides, device = _stored_form(tensor, declared_dtypes.get(name), where, name)
            strides = tuple((call.get("strides") or {}).get(name, strides))
            device = (call.get("devices") or {}).get(name, device)
            if data.ndim > MAX_RANK:
                raise ValueError(f"{where}: field '{name}': more than {MAX_RANK} dims")
            if len(strides) != data.ndim:
                raise ValueError(f"{where}: field '{name}': {len(strides)} strides for {data.ndim} dims")
            flat = data.reshape(-1)
            digest = content_hash(flat)
            offset = None
            key = (dtype, flat.size, digest)
            if deduplicate:
                for earlier_offset, earlier in written.get(key, []):
                    if np.array_equal(earlier.view(np.uint8), flat.view(np.uint8)):
                        offset = earlier_offset
                        break
            if offset is None:
                offset = lengths[dtype]
                stored[dtype].append(flat)
                lengths[dtype] += flat.size
                written.setdefault(key, []).append((offset, flat))
            row = np.zeros((), dtype=_TENSOR_ROW)
            row["call_index"] = call_index
            row["name"] = name.encode()
            row["dtype"] = dtype.encode()
            row["ndim"] = data.ndim
            row["shape"][:data.ndim] = data.shape
            row["strides"][:data.ndim] = strides
            row["device"] = _fixed(device, NAME_SIZE, where, f"devices.{name}")
            row["offset"] = offset
            row["numel"] = flat.size
            row["content_hash"] = digest
            tensor_rows.append(row)

        meta = dict(call.get("metadata") or {})
        op, backend = str(call.get("op", "")), str(call.get("backend", ""))
        # Too long for the fixed-length field: the whole name goes into the metadata too.
        if len(op.encode()) > OP_SIZE:
            meta["op"] = op
        if len(backend.encode()) > OP_SIZE:
            meta["backend"] = backend
        text = json.dumps(meta, separators=(",", ":")).encode("utf-8")
        scale = call.get("scale")
        layout = str(call.get("layout", "bhsd")).lower()
        alignment = str(call.get("causal_alignment", "top_left"))
        if layout not in LAYOUTS:
            raise ValueError(f"{where}: field 'layout': expected bhsd, bshd or thd, got '{layout}'")
        if alignment not in ("top_left", "bottom_right"):
            raise ValueError(f"{where}: field 'causal_alignment': expected top_left or bottom_right, got '{alignment}'")
        row = np.zeros((), dtype=_CALL_ROW)
        row["call_index"] = call_index
        row["op"] = op.encode()[:OP_SIZE]
        row["backend"] = backend.encode()[:OP_SIZE]
        row["layout"] = layout.encode()
        row["is_causal"] = bool(call.get("is_causal", False))
        row["causal_alignment"] = alignment.encode()
        row["scale"] = math.nan if scale is None else float(scale)
        row["dropout_p"] = float(call.get("dropout_p", 0.0) or 0.0)
        row["enable_gqa"] = bool(call.get("enable_gqa", False))
        for side in ("window_left", "window_right"):
            row[side] = -1 if call.get(side) is None else int(call[side])
        row["softcap"] = float(call.get("softcap", 0.0) or 0.0)
        row["first_tensor"] = first_tensor
        row["tensor_count"] = len(tensor_rows) - first_tensor
        row["metadata_offset"] = len(metadata)
        row["metadata_nbytes"] = len(text)
        metadata += text
        call_rows.append(row)

    with h5py.File(path, "w") as f:
        f.attrs["attnreplay_schema"] = np.bytes_(SCHEMA_NAME)
        f.attrs["schema_version"] = np.int64(SCHEMA_VERSION)
        f.attrs["producer"] = np.bytes_(producer or "attnreplay_h5.py")
        f.attrs["created_utc"] = np.bytes_(datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
        _appendable(f, "calls", _CALL_ROW, 64, np.array(call_rows, dtype=_CALL_ROW))
        _appendable(f, "tensors", _TENSOR_ROW, 256, np.array(tensor_rows, dtype=_TENSOR_ROW))
        _appendable(f, "metadata_json", np.dtype("u1"), 64 * 1024, np.frombuffer(bytes(metadata), dtype="u1"))
        group = f.create_group("data")
        for dtype, storage in DTYPES.items():
            parts = stored[dtype]
            data = np.concatenate(parts).astype(storage, copy=False) if parts else np.zeros(0, dtype=storage)
            dataset = _appendable(group, dtype, storage, (1 << 20) // storage.itemsize, data)
            dataset.attrs["torch_dtype"] = np.bytes_(dtype)
            dataset.attrs["storage"] = np.bytes_(_STORAGE_NOTES.get(dtype, "native"))
    return len(call_rows)
