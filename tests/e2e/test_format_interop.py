"""The capture formats between C++ and Python, bit for bit, for every dtype and both layouts.

C++ writes (run --save-inputs .h5/.pt, convert) and Python reads (attnreplay_h5, torch.load
with weights_only=True); Python writes (attnreplay_h5.write_calls, torch.save of our .pt schema,
aiter-style dicts and folders with non-contiguous views) and C++ reads (convert back to .pt or
.h5, and info).
"""

import math

import h5py
import numpy as np
import pytest
import torch

import attnreplay_h5
from conftest import FAST, capture_of_killed_writer, load_pt, run_attnreplay

# attnreplay's --dtype spelling -> torch dtype
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64,
          "fp8": torch.float8_e4m3fn}
LAYOUTS = ("bhsd", "bshd")
# Shape flags of the generated calls: GQA and unequal lengths, so no dim can stand in for another.
SHAPE_FLAGS = ["--shape", "2,4,6,8", "--num_kv_heads", "2", "--s_kv", "10", "--head_dim_vo", "4"]
BHSD = {"q": (2, 4, 6, 8), "k": (2, 2, 10, 8), "v": (2, 2, 10, 4)}


def dims(name, layout):
    b, h, s, d = BHSD[name]
    return (b, h, s, d) if layout == "bhsd" else (b, s, h, d)


def bits(tensor):
    """The tensor's elements as unsigned integers of its width: equal bits, equal arrays."""
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor.contiguous().view(width).numpy()


def assert_same_bits(a, b, what):
    assert a.dtype == b.dtype, f"{what}: {a.dtype} != {b.dtype}"
    assert tuple(a.shape) == tuple(b.shape), f"{what}: {tuple(a.shape)} != {tuple(b.shape)}"
    assert np.array_equal(bits(a), bits(b)), f"{what}: bits differ"


@pytest.fixture(scope="module")
def cpp_written(tmp_path_factory):
    """For each (dtype, layout): the generated call saved by C++ as .h5 and as .pt.

    One test list runs every configuration, so the binary (and libtorch) starts once.
    """
    folder = tmp_path_factory.mktemp("cpp")
    files, lines = {}, []
    for dtype in DTYPES:
        for layout in LAYOUTS:
            stem = folder / f"{dtype}_{layout}"
            for suffix in (".h5", ".pt"):
                lines.append(" ".join([*SHAPE_FLAGS, "--dtype", dtype, "--layout", layout, "--kernels", "reference",
                                       "--save-inputs", f"{stem}{suffix}", "--save-outputs", f"{stem}_outs", *FAST]))
            files[dtype, layout] = stem
    (folder / "list.txt").write_text("\n".join(lines) + "\n")
    run_attnreplay("run", "--testlist", folder / "list.txt", "-q", check=0)
    return files


CASES = [(d, l) for d in DTYPES for l in LAYOUTS]


@pytest.mark.parametrize("dtype,layout", CASES)
def test_cpp_h5_read_by_h5py(cpp_written, dtype, layout):
    stem = cpp_written[dtype, layout]
    (call,) = attnreplay_h5.read_calls(f"{stem}.h5")
    (as_torch,) = attnreplay_h5.read_calls(f"{stem}.h5", as_torch=True)
    name = str(DTYPES[dtype]).removeprefix("torch.")
    assert call["layout"] == layout and call["scale"] is None and call["op"] == "generated"
    assert call["enable_gqa"] is True and call["mask"] is None and call["out"] is None
    for field in "qkv":
        assert call["dtypes"][field] == name
        assert call[field].shape == dims(field, layout)
        assert as_torch[field].dtype == DTYPES[dtype]
        # numpy values are the torch tensor's values, exactly (bf16/fp8 widened to float32).
        np.testing.assert_array_equal(call[field].astype(np.float64), as_torch[field].double().numpy())
        assert np.array_equal(call["bits"][field].reshape(-1).view(np.uint8),
                              bits(as_torch[field]).reshape(-1).view(np.uint8))
        strides = [1]
        for d in reversed(call[field].shape[1:]):
            strides.insert(0, strides[0] * d)
        assert call["strides"][field] == tuple(strides)
        assert attnreplay_h5.content_hash(call["bits"][field]) == \
            int(h5py.File(f"{stem}.h5", "r")["tensors"]["content_hash"]["qkv".index(field)])
    # The values are what C++ computed with: numpy's attention of them is the saved reference.
    q, k, v = (np.asarray(call[f], dtype=np.float64) for f in "qkv")
    if layout == "bshd":
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    k, v = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)
    scores = np.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(8)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    expected = np.einsum("bhij,bhjd->bhid", weights / weights.sum(axis=-1, keepdims=True), v)
    reference = load_pt(f"{stem}_outs/call0_reference.pt")["out"].numpy()
    np.testing.assert_allclose(reference, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_h5_storage_is_as_documented(cpp_written, dtype):
    # docs/format.md: fp16/32/64 native, bf16 as uint16 bits, fp8 as uint8 bits; the one-liners work.
    stem = cpp_written[dtype, "bhsd"]
    with h5py.File(f"{stem}.h5", "r") as f:
        assert f.attrs["attnreplay_schema"] == b"attnreplay.capture" and f.attrs["schema_version"] == 2
        name = str(DTYPES[dtype]).removeprefix("torch.")
        stored = f[f"data/{name}"][()]
        row = f["tensors"][0]
        q = stored[row["offset"]:row["offset"] + row["numel"]].reshape(row["shape"][:row["ndim"]])
    (call,) = attnreplay_h5.read_calls(f"{stem}.h5", as_torch=True)
    if dtype == "bf16":
        assert stored.dtype == np.uint16
        np.testing.assert_array_equal((q.astype("<u4") << 16).view("<f4"), call["q"].float().numpy())
    elif dtype == "fp8":
        assert stored.dtype == np.uint8
        assert torch.equal(torch.from_numpy(q).view(torch.float8_e4m3fn).float(), call["q"].float())
    else:
        assert stored.dtype == {"fp16": np.float16, "fp32": np.float32, "fp64": np.float64}[dtype]
        np.testing.assert_array_equal(q, call["q"].numpy())


@pytest.mark.parametrize("dtype,layout", CASES)
def test_cpp_pt_read_by_torch_load(cpp_written, dtype, layout):
    stem = cpp_written[dtype, layout]
    root = load_pt(f"{stem}.pt")
    assert root["format"] == "attnreplay.capture" and root["schema_version"] == 2
    (call,) = root["calls"]
    assert call["format"] == "attnreplay.call" and call["layout"] == layout and call["scale"] is None
    assert call["is_causal"] is False and call["call_index"] == 0 and call["mask"] is None
    (from_h5,) = attnreplay_h5.read_calls(f"{stem}.h5", as_torch=True)
    for field in "qkv":
        assert_same_bits(call[field], from_h5[field], f"{dtype} {layout} {field}")
        assert tuple(call[field].shape) == dims(field, layout)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpp_convert_keeps_bits(cpp_written, tmp_path, dtype):
    # .h5 -> .pt and .pt -> .h5 (bshd: the layout must travel too): every copy holds the same bits.
    stem = cpp_written[dtype, "bshd"]
    run_attnreplay("convert", f"{stem}.h5", tmp_path / "c.pt", check=0)
    run_attnreplay("convert", f"{stem}.pt", tmp_path / "c.h5", check=0)
    (original,) = attnreplay_h5.read_calls(f"{stem}.h5", as_torch=True)
    (via_h5,) = attnreplay_h5.read_calls(str(tmp_path / "c.h5"), as_torch=True)
    (via_pt,) = load_pt(tmp_path / "c.pt")["calls"]
    for field in "qkv":
        for copy, what in ((via_h5, "h5"), (via_pt, "pt")):
            assert_same_bits(copy[field], original[field], f"{what} {field}")
    assert via_h5["layout"] == via_pt["layout"] == "bshd"


def test_cpp_convert_to_folder(cpp_written, tmp_path):
    stem = cpp_written["bf16", "bshd"]
    run_attnreplay("convert", f"{stem}.h5", f"{tmp_path / 'folder'}/", check=0)
    (original,) = attnreplay_h5.read_calls(f"{stem}.h5", as_torch=True)
    via_folder = load_pt(tmp_path / "folder" / "call_000000.pt")
    assert via_folder["format"] == "attnreplay.call" and via_folder["layout"] == "bshd"
    for field in "qkv":
        assert_same_bits(via_folder[field], original[field], field)


def test_cpp_pt_loads_with_plain_weights_only(cpp_written):
    # pt_format.h promises files that Python's torch.load(weights_only=True) reads, as is.
    torch.load(f"{cpp_written['fp32', 'bhsd']}.pt", weights_only=True)
    torch.load(f"{cpp_written['fp32', 'bhsd']}_outs/call0_reference.pt", weights_only=True)
    # fp8 travels as uint8 bits, its dtype named under 'dtypes'.
    (call,) = torch.load(f"{cpp_written['fp8', 'bhsd']}.pt", weights_only=True)["calls"]
    assert call["q"].dtype == torch.uint8 and call["dtypes"]["q"] == "float8_e4m3fn"


def test_python_fp8_pt_is_read_as_torch_saved_it(tmp_path):
    # torch.save pickles fp8 with _rebuild_tensor_v3, which libtorch's C++ reader cannot rebuild;
    # attnreplay's own reader (formats/torch_save.cpp) takes its dtype argument.
    x = torch.randn(1, 2, 4, 8).to(torch.float8_e4m3fn)
    y = torch.randn(1, 2, 4, 8).to(torch.float8_e5m2)
    torch.save({"q": x, "k": x, "v": y}, tmp_path / "raw_fp8.pt")
    info = run_attnreplay("info", tmp_path / "raw_fp8.pt", "--verify", check=0)
    assert "float8_e4m3fn" in info.stdout
    run_attnreplay("convert", tmp_path / "raw_fp8.pt", tmp_path / "raw_fp8.h5", check=0)
    (call,) = attnreplay_h5.read_calls(str(tmp_path / "raw_fp8.h5"), as_torch=True)
    assert call["q"].dtype == torch.float8_e4m3fn and call["v"].dtype == torch.float8_e5m2
    assert torch.equal(call["q"].view(torch.uint8), x.view(torch.uint8))
    assert torch.equal(call["v"].view(torch.uint8), y.view(torch.uint8))


# ---------------------------------------------------------------------------------------------
# Python writes, C++ reads

PY_DTYPES = {**DTYPES, "fp8_e5m2": torch.float8_e5m2}


def python_call(dtype, layout, index, seed):
    """A call with every optional field set, in `layout`, as torch tensors."""
    g = torch.Generator().manual_seed(seed)

    def tensor(name):
        return (torch.randn(dims(name, layout), generator=g) * 3).to(dtype)

    b, h, s, _ = BHSD["q"]
    return {"call_index": index, "op": "my_attention", "backend": "my_backend", "layout": layout,
            "is_causal": index % 2 == 1, "causal_alignment": "bottom_right", "scale": 0.125 + index,
            "dropout_p": 0.0, "enable_gqa": True, "q": tensor("q"), "k": tensor("k"), "v": tensor("v"),
            "mask": torch.rand(b, 1, s, BHSD["k"][2], generator=g) > 0.5,
            "out": (torch.randn(dims("q", layout)[:3] + (4,), generator=g)).to(dtype),
            "metadata": {"layer": str(index)}}


def assert_call_matches(got, want, what):
    for field in ("q", "k", "v", "mask", "out"):
        assert_same_bits(got[field], want[field], f"{what} {field}")
    for field in ("call_index", "op", "backend", "layout", "is_causal", "causal_alignment", "enable_gqa"):
        assert got[field] == want[field], (what, field, got[field], want[field])
    assert got["scale"] == pytest.approx(want["scale"], rel=1e-15)
    assert got["metadata"] == want["metadata"]


PY_CASES = [(d, l) for d in PY_DTYPES for l in LAYOUTS]


def group_of(dtype):
    # fp8 files are kept apart, so that an fp8 problem cannot hide the other dtypes' results.
    return "fp8" if dtype.startswith("fp8") else "other"


@pytest.fixture(scope="module")
def python_written(tmp_path_factory):
    """Per group: Python-written captures and what C++ made of them (one binary start each)."""
    folder = tmp_path_factory.mktemp("python")
    groups = {}
    for group in ("fp8", "other"):
        cases = [(i, d, l) for i, (d, l) in enumerate(PY_CASES) if group_of(d) == group]
        h5_calls = {(d, l): python_call(PY_DTYPES[d], l, i, seed=i) for i, d, l in cases}
        pt_calls = {(d, l): dict(python_call(PY_DTYPES[d], l, i, seed=100 + i), format="attnreplay.call",
                                 schema_version=1) for i, d, l in cases if d in DTYPES}
        g = folder / group
        (g / "one_per_file").mkdir(parents=True)
        attnreplay_h5.write_calls(str(g / "py.h5"), list(h5_calls.values()))
        # fp8 is saved as its bits with the dtype declared, as docs/format.md says to.
        saved = [as_bits(call) for call in pt_calls.values()]
        for call in saved:
            torch.save(call, g / "one_per_file" / f"call_{call['call_index']}.pt")
        torch.save({"format": "attnreplay.capture", "schema_version": 1, "calls": saved[::-1]}, g / "many.pt")
        groups[group] = {
            "h5_calls": h5_calls, "pt_calls": pt_calls, "folder": g,
            "info_h5": run_attnreplay("info", g / "py.h5"),
            "h5_to_h5": run_attnreplay("convert", g / "py.h5", g / "py.back.h5"),
            "h5_to_pt": run_attnreplay("convert", g / "py.h5", g / "py.back.pt"),
            "info_pt": run_attnreplay("info", g / "many.pt"),
            "many_to_pt": run_attnreplay("convert", g / "many.pt", g / "many.back.pt"),
            "files_to_pt": run_attnreplay("convert", g / "one_per_file", g / "one_per_file.back.pt"),
        }
    return groups


def as_bits(call):
    """The call as Python should torch.save it for C++: fp8 tensors as uint8 plus 'dtypes'."""
    fp8 = (torch.float8_e4m3fn, torch.float8_e5m2)
    saved, dtypes = dict(call), {}
    for key, value in call.items():
        if isinstance(value, torch.Tensor) and value.dtype in fp8:
            saved[key] = value.view(torch.uint8)
            dtypes[key] = str(value.dtype).removeprefix("torch.")
    if dtypes:
        saved["dtypes"] = dtypes
    return saved


def converted(result, what):
    assert result.returncode == 0, f"{what}: exit {result.returncode}\n{result.stdout}{result.stderr}"
    return result.stdout


def find_call(calls, call_index):
    (call,) = [c for c in calls if c["call_index"] == call_index]
    return call


@pytest.mark.parametrize("dtype,layout", PY_CASES)
def test_python_h5_read_by_cpp(python_written, dtype, layout):
    group = python_written[group_of(dtype)]
    want = group["h5_calls"][dtype, layout]
    name = str(PY_DTYPES[dtype]).removeprefix("torch.")
    info = converted(group["info_h5"], "info")
    lines = info.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:1] == [str(want["call_index"])])
    row = lines[at].split()
    assert row[1:3] == ["my_attention", name] and row[3] == layout
    assert row[4:11] == ["b2", "hq4", "hkv2", "sq6", "skv10", "dqk8", "dvo4"]
    assert "backend=my_backend" in lines[at + 1].split()
    # C++ read the file and wrote it again: the .h5 it wrote holds the same bits ...
    converted(group["h5_to_h5"], "convert to .h5")
    got = find_call(attnreplay_h5.read_calls(str(group["folder"] / "py.back.h5"), as_torch=True), want["call_index"])
    assert_call_matches(got, want, f"{dtype} {layout} via h5")
    # ... and so does the .pt, as torch.load reads it.
    converted(group["h5_to_pt"], "convert to .pt")
    got = find_call(load_pt(group["folder"] / "py.back.pt")["calls"], want["call_index"])
    assert_call_matches(got, want, f"{dtype} {layout} via pt")


@pytest.mark.parametrize("dtype,layout", CASES)
def test_python_pt_schema_read_by_cpp(python_written, dtype, layout):
    # torch.save of our .pt schema: one call per file (a folder of them), and one
    # {"format": "attnreplay.capture", "calls": [...]} file, given in reverse call order.
    group = python_written[group_of(dtype)]
    want = group["pt_calls"][dtype, layout]
    for source in ("many", "files"):
        converted(group[f"{source}_to_pt"], f"convert {source}")
    many = load_pt(group["folder"] / "many.back.pt")["calls"]
    assert [c["call_index"] for c in many] == sorted(c["call_index"] for c in group["pt_calls"].values())
    assert_call_matches(find_call(many, want["call_index"]), want, f"{dtype} {layout} many.pt")
    files = load_pt(group["folder"] / "one_per_file.back.pt")["calls"]
    assert_call_matches(find_call(files, want["call_index"]), want, f"{dtype} {layout} one per file")
    info = converted(group["info_pt"], "info")
    assert f"many.pt: pt, {len(group['pt_calls'])} calls" in info


def aiter_call(index, seed):
    """What aiter's capture saves: views into one fused QKV projection (non-contiguous)."""
    g = torch.Generator().manual_seed(seed)
    b, s, h, d = 2, 7, 3, 8
    qkv = torch.randn(b, s, 3 * h * d, generator=g).to(torch.bfloat16)
    q, k, v = qkv.view(b, s, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)  # (b, h, s, d) views
    assert not q.is_contiguous() and k.storage_offset() > 0
    mask = torch.rand(b, 1, s, s, generator=g) > 0.3
    return {"q": q, "k": k, "v": v, "q_shape": tuple(q.shape), "k_shape": tuple(k.shape),
            "v_shape": tuple(v.shape), "dtype": str(q.dtype), "call_idx": index, "attn_mask": mask,
            "kwargs": {"dropout_p": 0.0, "is_causal": index == 2, "scale": 0.5 / (index + 1)},
            "out": torch.randn(b, h, s, d, generator=g).to(torch.bfloat16)}


def test_aiter_folder_read_by_cpp(tmp_path):
    folder = tmp_path / "aiter"
    folder.mkdir()
    # File names do not give the order: call_idx does. The _metadata.pt summary is no call.
    written = {}
    for file_number, call_index in enumerate((2, 0, 1)):
        written[call_index] = aiter_call(call_index, seed=call_index)
        torch.save(written[call_index], folder / f"sdpa_input_{file_number}.pt")
    torch.save({"num_captures": 3, "kernel": "sdpa"}, folder / "sdpa_metadata.pt")
    info = run_attnreplay("info", folder, check=0).stdout
    assert "pt-folder, 3 calls" in info and "3 x sdpa" in info and "bool 2x1x7x7" in info
    run_attnreplay("convert", folder, tmp_path / "back.pt", check=0)
    got = load_pt(tmp_path / "back.pt")["calls"]
    assert [c["call_index"] for c in got] == [0, 1, 2]
    for call in got:
        want = written[call["call_index"]]
        for field in ("q", "k", "v", "out"):
            assert_same_bits(call[field], want[field], f"call {call['call_index']} {field}")
            assert call[field].stride() == want[field].stride()  # the model's strides are kept
        assert torch.equal(call["mask"], want["attn_mask"])
        assert call["op"] == "sdpa" and call["layout"] == "bhsd"
        assert call["scale"] == want["kwargs"]["scale"]
        assert call["is_causal"] == want["kwargs"]["is_causal"]


def test_plain_dicts_read_by_cpp(tmp_path):
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=g).to(torch.float16) for _ in range(3))
    torch.save({"query": q, "key": k, "value": v}, tmp_path / "long.pt")
    torch.save({"q": q.transpose(2, 3).contiguous().transpose(2, 3), "k": k, "v": v, "is_causal": True,
                "scale": 0.25}, tmp_path / "short.pt")
    for name in ("long.pt", "short.pt"):
        run_attnreplay("convert", tmp_path / name, tmp_path / f"{name}.h5", check=0)
        (call,) = attnreplay_h5.read_calls(str(tmp_path / f"{name}.h5"), as_torch=True)
        for field, want in zip("qkv", (q, k, v)):
            assert_same_bits(call[field], want, f"{name} {field}")
        assert call["op"] == "unknown"
    assert call["is_causal"] is True and call["scale"] == 0.25
    assert call["strides"]["q"] == (80, 40, 1, 5)  # a column-major view: its strides are recorded


def test_killed_writer_leaves_a_readable_file(tmp_path):
    # The writer appends the generated call, then replays it for a long time; kill it then. The
    # file keeps its SWMR-writing flag: plain h5py refuses it, SWMR readers and attnreplay read it.
    path = tmp_path / "killed.h5"
    capture_of_killed_writer(path)
    with pytest.raises(OSError):
        h5py.File(path, "r")
    with h5py.File(path, "r", swmr=True) as f:
        assert f["calls"].shape == (1,)
    (call,) = attnreplay_h5.read_calls(str(path), as_torch=True)
    run_attnreplay("convert", path, tmp_path / "back.pt", check=0)
    (back,) = load_pt(tmp_path / "back.pt")["calls"]
    for field in "qkv":
        assert_same_bits(back[field], call[field], field)
    assert "attnreplay-hdf5 v2, 1 calls" in run_attnreplay("info", path, check=0).stdout


def test_attnreplay_h5_decodes_every_fp8_pattern_as_torch_does():
    # The module's pure-numpy decoding (no torch needed) against torch's own, for all 256 patterns.
    patterns = np.arange(256, dtype=np.uint8)
    for name in ("float8_e4m3fn", "float8_e5m2"):
        ours = attnreplay_h5.decode(patterns, name)
        theirs = torch.from_numpy(patterns).view(getattr(torch, name)).float().numpy()
        np.testing.assert_array_equal(ours, theirs)
        assert np.array_equal(np.signbit(ours), np.signbit(theirs))
        # Back to bits: every pattern but e5m2's several NaNs (one NaN per sign comes back).
        unique = ~np.isnan(ours) | np.isin(patterns, [0x7F, 0xFF])
        assert np.array_equal(attnreplay_h5.encode(ours[unique], name), patterns[unique])


@pytest.mark.parametrize("dtype", DTYPES)
def test_attnreplay_h5_numpy_round_trip(cpp_written, tmp_path, dtype):
    # read_calls' numpy form (bf16/fp8 widened to float32) written back gives the same bits.
    calls = attnreplay_h5.read_calls(f"{cpp_written[dtype, 'bshd']}.h5")
    attnreplay_h5.write_calls(str(tmp_path / "again.h5"), calls)
    (again,) = attnreplay_h5.read_calls(str(tmp_path / "again.h5"))
    for field in "qkv":
        assert again["dtypes"][field] == calls[0]["dtypes"][field]
        assert np.array_equal(again["bits"][field], calls[0]["bits"][field])
        assert again["strides"][field] == calls[0]["strides"][field]
    for key in ("call_index", "op", "layout", "scale", "metadata", "is_causal", "enable_gqa"):
        assert again[key] == calls[0][key]
