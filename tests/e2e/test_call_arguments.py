"""Every argument of a call honoured or loudly refused (replay/call_semantics.h). flash-attn's
forward op, registered under its own name and schema by tests/e2e/jobs/flash_attn_op_job.py, is
captured with a sliding window, a softcap and ALiBi slopes: those calls are refused kernel by
kernel with the argument named, never replayed as full attention, while the plain call replays
to the model's output."""
import numpy as np
import pytest

from capture_common import read_calls, run_python_job, the_capture
from conftest import FAST, load_json, run_attnreplay


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("flash_attn_op")
    run_python_job("flash_attn_op_job.py", "--save", folder / "plain.npz", preload=False)
    run_python_job("flash_attn_op_job.py", "--save", folder / "captured.npz", out=folder / "caps")
    capture = the_capture(folder / "caps")
    report = folder / "r.json"
    result = run_attnreplay("run", capture, "--kernels", "reference,torch-math", "--json", report, *FAST, check=0)
    return folder, read_calls(capture), load_json(report), result.stdout


def test_capture_changes_nothing_and_keeps_every_argument(replayed):
    folder, calls, _, _ = replayed
    plain, captured = np.load(folder / "plain.npz"), np.load(folder / "captured.npz")
    assert all(np.array_equal(plain[k], captured[k]) for k in plain.files)
    assert [c["op"] for c in calls] == ["flash_attn::_flash_attn_forward"] * 4
    args = [{k[4:]: v for k, v in c["metadata"].items() if k.startswith("arg.")} for c in calls]
    assert args[0] == {"window_size_left": "-1", "window_size_right": "-1", "softcap": "0", "alibi_slopes": "None",
                       "return_softmax": "False"}
    assert args[1]["window_size_left"] == "4" and args[1]["window_size_right"] == "0"
    assert args[2]["softcap"] == "30"
    assert args[3]["alibi_slopes"] == "tensor Float [3]"


@pytest.mark.parametrize("index,refused", [(1, "window_size_left=4 (a sliding window)"),
                                           (2, "softcap=30 (a softcap on the scores)"),
                                           (3, "alibi_slopes=tensor Float [3] (ALiBi biases)")])
def test_a_call_the_record_cannot_represent_is_refused_with_the_argument_named(replayed, index, refused):
    _, _, report, stdout = replayed
    call = report["calls"][index]
    kernels = {k["kernel"]: k for k in call["kernels"]}
    assert set(kernels) == {"reference", "torch-math"}  # no model-output judged against the wrong answer
    for kernel in kernels.values():
        assert kernel["status"] == "not_supported" and refused in kernel["reason"], kernel
        assert "error" not in kernel and "timing" not in kernel
    assert any(refused in note for note in call["notes"])
    assert refused in stdout


def test_the_plain_call_replays_to_the_models_output(replayed):
    _, _, report, _ = replayed
    kernels = {k["kernel"]: k for k in report["calls"][0]["kernels"]}
    assert kernels["torch-math"]["status"] == "not_verified"
    assert kernels["model-output"]["error"]["rel_l2"] < 1e-6, kernels["model-output"]
