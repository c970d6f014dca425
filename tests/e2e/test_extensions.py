"""Sliding windows, softcap, ALiBi and attention sinks in the record (schema v2) and the fp64
reference: a .pt call with every extension at once replays to an independent float64 computation,
survives conversion to HDF5, and a schema v1 file (without those fields) still reads."""
import math

import h5py
import numpy as np
import pytest
import torch

from capture_common import read_calls
from conftest import FAST, load_json, run_attnreplay

B, HQ, HKV, SQ, SKV, D = 2, 4, 2, 5, 9, 8


def expected_output(q, k, v, mask, *, scale, causal, window_left, window_right, softcap, alibi, sinks):
    """What the record says the call computes, written out on its own (bottom-right alignment)."""
    k, v = (t.repeat_interleave(HQ // HKV, dim=1) for t in (k, v))
    scores = q @ k.transpose(-1, -2) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    diagonal = torch.arange(SQ).view(-1, 1) + (SKV - SQ)
    keys = torch.arange(SKV).view(1, -1)
    scores = scores - alibi.view(B, HQ, 1, 1) * (diagonal - keys).abs()
    allowed = mask.clone()
    if causal:
        allowed &= keys <= diagonal
    allowed &= (keys >= diagonal - window_left) & (keys <= diagonal + window_right)
    scores = scores.masked_fill(~allowed, -math.inf)
    # The sink joins each row's softmax denominator and adds no value.
    with_sink = torch.cat([scores, sinks.view(1, HQ, 1, 1).expand(B, HQ, SQ, 1)], dim=-1)
    probabilities = torch.softmax(with_sink, dim=-1)[..., :SKV].nan_to_num(0.0)
    return probabilities @ v


@pytest.fixture(scope="module")
def every_extension(tmp_path_factory):
    folder = tmp_path_factory.mktemp("extensions")
    g = torch.Generator().manual_seed(3)
    q = torch.randn(B, HQ, SQ, D, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, HKV, SKV, D, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.rand(B, 1, SQ, SKV, generator=g) > 0.2
    mask[1, 0, 2] = False  # a row that sees no key at all
    alibi = torch.tensor([[0.5, 0.25, 0.125, 0.0625], [0.3, 0.2, 0.1, 0.05]], dtype=torch.float32)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float32)
    options = dict(scale=0.3, causal=True, window_left=3, window_right=1, softcap=2.5)
    out = expected_output(q, k, v, mask, alibi=alibi.double(), sinks=sinks.double(), **options)
    call = {"format": "attnreplay.call", "schema_version": 2, "call_index": 0, "op": "test::extensions",
            "backend": "", "layout": "bhsd", "is_causal": True, "causal_alignment": "bottom_right", "scale": 0.3,
            "dropout_p": 0.0, "enable_gqa": True, "window_left": 3, "window_right": 1, "softcap": 2.5,
            "q": q, "k": k, "v": v, "mask": mask, "out": out, "alibi_slopes": alibi, "sinks": sinks, "metadata": {}}
    path = folder / "call.pt"
    torch.save(call, path)
    return folder, path


def test_every_extension_at_once_replays_to_an_independent_computation(every_extension):
    folder, path = every_extension
    report = folder / "r.json"
    run_attnreplay("run", path, "--kernels", "reference,torch-math", "--json", report, *FAST, check=0)
    call = load_json(report)["calls"][0]
    assert call["extensions"] == ["a sliding window (left 3, right 1)", "a softcap of 2.5", "ALiBi slopes",
                                  "attention sinks"]
    kernels = {k["kernel"]: k for k in call["kernels"]}
    model = kernels["model-output"]["error"]
    assert model["max_abs"] < 1e-13, model
    assert model["no_key_rows"] > 0 and model["including_rows_without_a_key"]["max_abs"] < 1e-13
    assert kernels["torch-math"]["status"] == "not_supported"
    assert kernels["torch-math"]["reason"] == ("the call has a softcap of 2.5 and ALiBi slopes and attention sinks, "
                                               "which this kernel does not compute")


def test_extensions_survive_conversion_to_hdf5(every_extension):
    folder, path = every_extension
    converted = folder / "call.h5"
    run_attnreplay("convert", path, converted, check=0)
    [call] = read_calls(converted)
    assert (call["window_left"], call["window_right"], call["softcap"]) == (3, 1, 2.5)
    assert np.array_equal(call["alibi_slopes"],
                          np.float32([[0.5, 0.25, 0.125, 0.0625], [0.3, 0.2, 0.1, 0.05]]))
    assert np.array_equal(call["sinks"], [0.5, -1.0, 2.0, 0.0])
    report = folder / "h5.json"
    run_attnreplay("run", converted, "--kernels", "reference", "--json", report, *FAST, check=0)
    model = {k["kernel"]: k for k in load_json(report)["calls"][0]["kernels"]}["model-output"]["error"]
    assert model["max_abs"] < 1e-13


def test_a_window_alone_replays_through_torch_as_a_mask(tmp_path):
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 12, 8, generator=g, dtype=torch.float64) for _ in range(3))
    path = tmp_path / "window.pt"
    torch.save({"format": "attnreplay.call", "schema_version": 2, "q": q, "k": k, "v": v, "is_causal": False,
                "window_left": 2, "window_right": 3, "layout": "bhsd"}, path)
    report = tmp_path / "r.json"
    run_attnreplay("run", path, "--kernels", "torch-math,torch-flash-cpu", "--json", report, *FAST, check=0)
    kernels = {k["kernel"]: k for k in load_json(report)["calls"][0]["kernels"]}
    for name in ("torch-math", "torch-flash-cpu"):
        assert kernels[name]["status"] == "not_verified" and kernels[name]["error"]["max_abs"] < 1e-13, kernels[name]


def test_a_schema_v1_file_still_reads(tmp_path):
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g) for _ in range(3))
    path = tmp_path / "v1.h5"
    import attnreplay_h5

    attnreplay_h5.write_calls(path, [{"q": q, "k": k, "v": v, "is_causal": True}])
    # Made a v1 file as an older attnreplay wrote it: the call rows without the v2 fields.
    with h5py.File(path, "r+") as f:
        rows = f["calls"][()]
        v1_fields = [name for name in rows.dtype.names if name not in ("window_left", "window_right", "softcap")]
        v1_rows = np.array([tuple(row[name] for name in v1_fields) for row in rows],
                           dtype=[(name, rows.dtype[name]) for name in v1_fields])
        del f["calls"]
        f.create_dataset("calls", data=v1_rows, maxshape=(None,), chunks=(64,))
        f.attrs["schema_version"] = np.int64(1)
    [call] = read_calls(path)
    assert (call["window_left"], call["window_right"], call["softcap"]) == (None, None, 0.0)
    report = tmp_path / "r.json"
    result = run_attnreplay("run", path, "--kernels", "torch-math", "--json", report, *FAST, check=0)
    record = load_json(report)
    assert record["calls"][0]["extensions"] == [] and record["calls"][0]["is_causal"]
    math = {k["kernel"]: k for k in record["calls"][0]["kernels"]}["torch-math"]
    assert math["status"] == "not_verified" and math["error"]["rel_l2"] < 1e-6, result.stdout
