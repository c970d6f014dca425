"""safetensors in and out (formats/safetensors_format.h, issue 59): a capture with every kind of
argument converted to .safetensors and back holds the same bits and fields; Hugging Face's own
reader (the `safetensors` package) reads the tensors and the call records; a file of plain q, k, v
tensors that Python wrote is replayed; a folder of them is one capture; a damaged file is an error
that names it."""
import json
import struct

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import capture_common  # noqa: F401  (the binary's default path when ctest does not set it)
import attnreplay_h5
from conftest import FAST, load_json, run_attnreplay

SCALARS = ("call_index", "op", "backend", "layout", "is_causal", "causal_alignment", "dropout_p", "enable_gqa",
           "window_left", "window_right", "softcap", "metadata")


def calls():
    """Three calls: GQA bf16 with a float mask, a window, a softcap and ALiBi; causal bottom-right
    bshd fp16 with sinks and strides of a view; a ragged (thd) batch with cu_seqlens."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 8, 16, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(2, 2, 12, 16, generator=g).to(torch.bfloat16) for _ in range(2))
    first = {"call_index": 3, "op": "aten::scaled_dot_product_attention", "backend": "math", "q": q, "k": k, "v": v,
             "mask": torch.randn(2, 1, 8, 12, generator=g), "scale": 0.3, "enable_gqa": True, "window_left": 4,
             "window_right": 0, "softcap": 30.0, "alibi_slopes": torch.rand(4, generator=g),
             "out": torch.randn(2, 4, 8, 16, generator=g).to(torch.bfloat16),
             "metadata": {"layer": "1", "step": "0", "call_site": "model.py:7 in forward"}}
    qb, kb, vb = (torch.randn(1, 6, 2, 8, generator=g).to(torch.float16) for _ in range(3))
    second = {"call_index": 4, "op": "flash_attn_func", "layout": "bshd", "q": qb, "k": kb, "v": vb, "is_causal": True,
              "causal_alignment": "bottom_right", "sinks": torch.randn(2, generator=g),
              "strides": {"q": (96, 8, 48, 1)}, "devices": {"q": "cuda:1"}, "metadata": {"layer": "2"}}
    lengths = [3, 5]
    qt, kt, vt = (torch.randn(sum(lengths), 2, 8, generator=g) for _ in range(3))
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    third = {"call_index": 5, "op": "flash_attn_varlen_func", "layout": "thd", "q": qt, "k": kt, "v": vt,
             "cu_seqlens_q": cu, "cu_seqlens_k": cu}
    return [first, second, third]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("safetensors")
    attnreplay_h5.write_calls(str(folder / "cap.h5"), calls())
    out = run_attnreplay("convert", folder / "cap.h5", folder / "cap.safetensors", check=0).stdout
    assert "3 of 3 calls written" in out
    run_attnreplay("convert", folder / "cap.safetensors", folder / "back.h5", check=0)
    return folder


def test_converted_there_and_back_the_same_bits_and_fields(converted):
    want = attnreplay_h5.read_calls(str(converted / "cap.h5"), as_torch=True)
    got = attnreplay_h5.read_calls(str(converted / "back.h5"), as_torch=True)
    assert len(got) == len(want) == 3
    for a, b in zip(got, want):
        for field in SCALARS:
            assert a.get(field) == b.get(field), (b["call_index"], field)
        assert a["scale"] == b["scale"]
        for field, tensor in b.items():
            if isinstance(tensor, torch.Tensor):
                assert a[field].dtype == tensor.dtype and torch.equal(a[field].view(torch.uint8),
                                                                      tensor.view(torch.uint8)), field
        assert a.get("strides") == b.get("strides") and a.get("devices") == b.get("devices")


def test_hugging_faces_reader_reads_the_tensors_and_the_calls(converted):
    want = attnreplay_h5.read_calls(str(converted / "cap.h5"), as_torch=True)
    with safe_open(str(converted / "cap.safetensors"), "pt") as f:
        metadata = f.metadata()
        assert metadata["format"] == "attnreplay-safetensors" and metadata["version"] == "1"
        records = json.loads(metadata["calls"])
        assert [r["call_index"] for r in records] == [3, 4, 5]
        assert records[0]["window_left"] == 4 and records[0]["softcap"] == 30.0 and records[1]["layout"] == "bshd"
        assert records[1]["tensors"]["q"] == {"strides": [96, 8, 48, 1], "device": "cuda:1"}
        for i, call in enumerate(want):
            for field in ("q", "k", "v", "mask", "out", "alibi_slopes", "sinks", "cu_seqlens_q"):
                if call.get(field) is not None:
                    assert torch.equal(f.get_tensor(f"call{i}.{field}"), call[field]), (i, field)


def test_a_plain_q_k_v_file_written_by_python_is_replayed(tmp_path):
    g = torch.Generator().manual_seed(1)
    save_file({"q": torch.randn(1, 2, 32, 16, generator=g), "k": torch.randn(1, 2, 40, 16, generator=g),
               "v": torch.randn(1, 2, 40, 16, generator=g), "mask": torch.rand(1, 1, 32, 40, generator=g) > 0.2},
              str(tmp_path / "inputs.safetensors"))
    info = run_attnreplay("info", tmp_path / "inputs.safetensors", check=0).stdout
    assert "safetensors (q, k, v), 1 calls" in info and "bool 1x1x32x40" in info
    run_attnreplay("run", tmp_path / "inputs.safetensors", "--kernels", "torch-math", "--refcheck", "--json",
                   tmp_path / "r.json", *FAST, check=0)
    row = load_json(tmp_path / "r.json")["calls"][0]["kernels"][0]
    assert row["status"] == "passed" and row["error"]["rel_l2"] < 1e-6


def test_a_folder_of_safetensors_files_is_one_capture(converted, tmp_path):
    for name in ("a", "b"):
        run_attnreplay("convert", converted / "cap.h5", tmp_path / f"{name}.safetensors", check=0)
    info = run_attnreplay("info", tmp_path, check=0).stdout
    assert "folder of 2 attnreplay-safetensors v1 files, 6 calls" in info


def test_a_damaged_file_is_an_error_naming_it(converted, tmp_path):
    data = (converted / "cap.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) - 100])
    result = run_attnreplay("info", tmp_path / "cut.safetensors", check=1)
    assert "cut.safetensors: tensor 'call" in result.stderr and "data_offsets" in result.stderr
    header = json.dumps({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    (tmp_path / "other.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    result = run_attnreplay("run", tmp_path / "other.safetensors", "--kernels", "torch-math", check=1)
    assert "other.safetensors" in result.stderr and "without tensors named q, k and v" in result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
