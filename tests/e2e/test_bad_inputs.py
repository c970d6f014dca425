"""Bad inputs give a non-zero exit and an error naming the file (and call and field), and never
stop the good calls beside them from running."""


from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import attnreplay_h5
from conftest import FAST, capture_of_killed_writer, load_json, run_attnreplay


def good_calls(count=3):
    rng = np.random.default_rng(11)
    return [{"call_index": i, "op": "op", "q": rng.standard_normal((1, 2, 4, 8)).astype(np.float32),
             "k": rng.standard_normal((1, 2, 6, 8)).astype(np.float32),
             "v": rng.standard_normal((1, 2, 6, 8)).astype(np.float32)} for i in range(count)]


def cpp_capture(path, shape="1,2,300,32"):
    """A valid capture written and closed by C++ (fp32, ~0.5 MB, so that half of it cuts data)."""
    run_attnreplay("run", "--shape", shape, "--dtype", "fp32", "--kernels", "reference", "--save-inputs", path,
                   "-q", *FAST, check=0)


def make_corrupt(path):
    # The HDF5 signature, then noise: it looks like HDF5 until the superblock is decoded.
    path.write_bytes(b"\x89HDF\r\n\x1a\n" + np.random.default_rng(0).bytes(4096))


_FULL_CAPTURE = {}


def make_truncated(path):
    if "bytes" not in _FULL_CAPTURE:  # one C++ run serves every test that cuts it
        full = path.with_name("full.h5")
        cpp_capture(full)
        _FULL_CAPTURE["bytes"] = full.read_bytes()
    data = _FULL_CAPTURE["bytes"]
    path.write_bytes(data[:len(data) // 2])


def make_bad_q_shape(path):
    q = torch.randn(1, 2, 4, 8)
    torch.save({"q": q, "k": q, "v": q, "q_shape": (1, 2, 4, 9)}, path)


def make_empty(path):
    path.write_bytes(b"")


def make_foreign_h5(path):
    with h5py.File(path, "w") as f:
        f["weights"] = np.arange(10.0)


# name: (file name, maker, what the message must also say)
BAD_FILES = {
    "corrupt_h5": ("corrupt.h5", make_corrupt, "cannot be read as HDF5"),
    "truncated_h5": ("truncated.h5", make_truncated, "truncated"),
    "pt_q_shape_disagrees": ("shape.pt", make_bad_q_shape, "field 'q_shape'"),
    "empty_file": ("empty.pt", make_empty, "empty file"),
    "nonexistent": ("missing.h5", None, "no such file"),
    "foreign_h5": ("foreign.h5", make_foreign_h5, "attnreplay_schema"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
@pytest.mark.parametrize("command", ["run", "info", "convert"])
def test_bad_file_is_a_clear_error(tmp_path, name, command):
    file_name, maker, detail = BAD_FILES[name]
    path = tmp_path / file_name
    if maker:
        maker(path)
    args = {"run": ["run", path, "--kernels", "reference", "--json", tmp_path / "r.json", *FAST],
            "info": ["info", path], "convert": ["convert", path, tmp_path / "out.pt"]}[command]
    result = run_attnreplay(*args)
    assert result.returncode != 0, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert f"{path}:" in output, output  # names the file ...
    assert detail in output, output     # ... and what is wrong with it
    if command == "run":
        report = load_json(tmp_path / "r.json")  # the results are still written
        assert report["calls"] == [] and len(report["input_errors"]) == 1 and str(path) in report["input_errors"][0]


def test_truncated_capture_of_a_killed_writer_is_an_error(tmp_path):
    # A killed writer leaves the SWMR-writing flag set, so the reader opens the file in SWMR mode,
    # where HDF5 skips its check of the file's length. Cut such a file short: the missing bytes
    # must not read back as zeros.
    path = tmp_path / "killed.h5"
    capture_of_killed_writer(path)
    data = path.read_bytes()
    cut = tmp_path / "killed_cut.h5"
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(attnreplay_h5.CaptureFormatError, match="truncated"):
        attnreplay_h5.read_calls(str(cut))  # the Python reader notices
    result = run_attnreplay("run", cut, "--kernels", "reference", "--json", tmp_path / "r.json", *FAST)
    assert result.returncode != 0, f"a file cut to half replayed as if whole:\n{result.stdout}"
    assert f"{cut}:" in result.stderr


CORRUPTIONS = {
    # name: (how the k row of call 1 is damaged, what the message must say)
    "shape_disagrees_with_numel": (lambda row: row["shape"].__setitem__(3, 9), "shape 1x2x6x9 has 108 elements"),
    "offset_beyond_data": (lambda row: row.__setitem__("offset", 10**6), "lie beyond '/data/float32'"),
    "negative_offset": (lambda row: row.__setitem__("offset", -1), "lie beyond '/data/float32'"),
    "unknown_dtype": (lambda row: row.__setitem__("dtype", b"float99"), "unknown dtype 'float99'"),
    "negative_dim": (lambda row: (row["shape"].__setitem__(2, -6), row.__setitem__("numel", 96)), "negative dim"),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_one_bad_call_does_not_stop_the_others(tmp_path, name):
    damage, message = CORRUPTIONS[name]
    path = tmp_path / "partly_bad.h5"
    attnreplay_h5.write_calls(str(path), good_calls(3))
    with h5py.File(path, "r+") as f:
        rows = f["tensors"][()]
        (index,) = [i for i, r in enumerate(rows) if r["call_index"] == 1 and r["name"] == b"k"]
        row = rows[index]
        damage(row)
        f["tensors"][index] = row
    result = run_attnreplay("run", path, "--kernels", "reference", "--json", tmp_path / "r.json", "-q", *FAST)
    assert result.returncode == 1, result.stdout + result.stderr
    report = load_json(tmp_path / "r.json")
    assert [c["call_index"] for c in report["calls"]] == [0, 2]
    assert f"{path}: call 1: field 'k': " in result.stderr and message in result.stderr, result.stderr
    assert report["input_errors"] == [line.removeprefix("error: ") for line in result.stderr.splitlines()]
    # info and convert also go on past the bad call, and say which it was.
    info = run_attnreplay("info", path)
    assert info.returncode == 1 and f"call 1: field 'k'" in info.stdout
    convert = run_attnreplay("convert", path, tmp_path / "out.h5")
    assert convert.returncode == 1 and "2 of 3 calls written" in convert.stdout
    assert [c["call_index"] for c in attnreplay_h5.read_calls(str(tmp_path / "out.h5"))] == [0, 2]


def test_bad_metadata_of_one_call(tmp_path):
    path = tmp_path / "bad_meta.h5"
    attnreplay_h5.write_calls(str(path), good_calls(2))
    with h5py.File(path, "r+") as f:
        row = f["calls"][1]
        row["metadata_nbytes"] = 10**6  # points past /metadata_json
        f["calls"][1] = row
    result = run_attnreplay("run", path, "--kernels", "reference", "--json", tmp_path / "r.json", "-q", *FAST)
    assert result.returncode == 1
    assert [c["call_index"] for c in load_json(tmp_path / "r.json")["calls"]] == [0]
    assert f"{path}: call 1: field 'metadata'" in result.stderr


# A test list: two good lines around one bad one. Each kind of bad line must be reported with
# FILE:LINE (docs/cli.md), whatever made it bad.
BAD_LINES = {
    "unknown_flag": "--shape 1,2,8,4 --bogus",
    "bad_shape": "--shape 1,2,8",
    "unknown_kernel": "--shape 1,2,8,4 --kernels nosuch",
    "gqa_heads_do_not_divide": "--shape 1,4,8,4 --num_kv_heads 3",
    "missing_capture": "{tmp}/missing.h5",
    "corrupt_capture": "{tmp}/corrupt.h5",
}


@pytest.mark.parametrize("name", sorted(BAD_LINES))
def test_testlist_bad_line(tmp_path, name):
    make_corrupt(tmp_path / "corrupt.h5")
    fast = " ".join(FAST)
    testlist = tmp_path / "list.txt"
    testlist.write_text("\n".join([
        "# two good lines around a bad one",
        f"--shape 1,2,8,4 --kernels reference {fast}",
        "",
        f"{BAD_LINES[name].format(tmp=tmp_path)} {fast}",
        f"attnreplay run --shape 1,2,8,4 --dtype fp32 --kernels reference {fast}",
    ]) + "\n")
    result = run_attnreplay("run", "--testlist", testlist, "--json", tmp_path / "r.json", "-q")
    assert result.returncode == 1, result.stdout + result.stderr
    report = load_json(tmp_path / "r.json")
    assert [(c["case_tag"], c["dtype"]) for c in report["calls"]] == [(f"{testlist}:2", "bfloat16"),
                                                                      (f"{testlist}:5", "float32")]
    assert len(report["input_errors"]) == 1, report["input_errors"]
    assert report["input_errors"][0].startswith(f"{testlist}:4: "), report["input_errors"]
    assert f"error: {testlist}:4: " in result.stderr


def test_folder_of_hdf5_captures_is_read_file_after_file(tmp_path):
    # Capture writes one HDF5 file per process into its folder: `attnreplay info caps/` reads them
    # all, in name order, and reports an unreadable one without losing the others.
    folder = tmp_path / "caps"
    folder.mkdir()
    for name, seed in (("b.h5", 1), ("a.h5", 2)):
        run_attnreplay("run", "--shape", "1,2,8,4", "--kernels", "reference", "--seed", seed,
                       "--save-inputs", folder / name, *FAST, check=0)
    (folder / "c.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64)
    info = run_attnreplay("info", folder, check=1)
    assert "folder of 2" in info.stdout and "2 calls" in info.stdout, info.stdout
    assert "c.h5" in info.stdout + info.stderr
    report = tmp_path / "r.json"
    run_attnreplay("run", folder, "--kernels", "reference", "--json", report, *FAST, check=1)
    calls = load_json(report)["calls"]
    assert [Path(c["source"]).name for c in calls] == ["a.h5", "b.h5"]
