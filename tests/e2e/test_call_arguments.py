"""Every argument of a call honoured or loudly refused (replay/judge/call_semantics.h). flash-attn's
forward op, registered under its own name and schema by tests/e2e/jobs/flash_attn_op_job.py, is
captured with a sliding window, a softcap and ALiBi slopes, which the record holds as fields: the
fp64 reference computes what the op computed, a torch backend replays the window as a mask, and a
kernel that cannot compute an extension is refused for it by name, never judged having computed
full attention. (Arguments the record does not know are refused too: tests/unit/
test_call_semantics.cpp.)"""
import numpy as np
import pytest

from capture_common import capture_and_replay


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("flash_attn_op")
    _, calls, report, replay = capture_and_replay("flash_attn_op_job.py", folder, "reference,torch-math")
    return folder, calls, report, replay.stdout


def test_capture_changes_nothing_and_keeps_every_argument(replayed):
    folder, calls, _, _ = replayed
    plain, captured = np.load(folder / "plain.npz"), np.load(folder / "captured.npz")
    assert all(np.array_equal(plain[k], captured[k]) for k in plain.files)
    assert [c["op"] for c in calls] == ["flash_attn::_flash_attn_forward"] * 5
    # The window, softcap and ALiBi slopes are fields of the record; what is left is only named.
    args = [{k[4:]: v for k, v in c["metadata"].items() if k.startswith("arg.")} for c in calls]
    assert all(a == {"return_softmax": "False"} for a in args), args
    assert [(c["window_left"], c["window_right"], c["softcap"]) for c in calls] == [
        (None, None, 0.0), (4, 0, 0.0), (None, None, 30.0), (None, None, 0.0), (6, 2, 20.0)]
    assert calls[0]["alibi_slopes"] is None
    assert np.array_equal(calls[3]["alibi_slopes"], [0.5, 0.25, 0.125])
    assert np.array_equal(calls[4]["alibi_slopes"], [0.5, 0.25, 0.125])


def test_the_reference_computes_what_the_op_computed(replayed):
    # Each call's captured output, the op's own fp32 computation, against the fp64 reference.
    _, _, report, _ = replayed
    for call in report["calls"]:
        kernels = {k["kernel"]: k for k in call["kernels"]}
        assert kernels["model-output"]["error"]["rel_l2"] < 1e-6, (call["extensions"], kernels["model-output"])
    assert [c["extensions"] for c in report["calls"]] == [
        [], ["a sliding window (left 4, right 0)"], ["a softcap of 30"], ["ALiBi slopes"],
        ["a sliding window (left 6, right 2)", "a softcap of 20", "ALiBi slopes"]]


def test_a_window_replays_through_a_torch_backend_and_the_rest_is_refused_by_name(replayed):
    _, _, report, stdout = replayed
    math = [{k["kernel"]: k for k in c["kernels"]}["torch-math"] for c in report["calls"]]
    # torch's backends take a sliding window as a mask: the window call replays to the op's output.
    assert math[1]["status"] == "not_verified" and math[1]["error"]["rel_l2"] < 1e-6, math[1]
    for index, missing in [(2, "a softcap of 30"), (3, "ALiBi slopes"), (4, "a softcap of 20 and ALiBi slopes")]:
        assert math[index]["status"] == "not_supported", math[index]
        assert math[index]["reason"] == f"the call has {missing}, which this kernel does not compute"
        assert "error" not in math[index] and "timing" not in math[index]
    assert "which this kernel does not compute" in stdout


def test_the_plain_call_replays_to_the_models_output(replayed):
    _, _, report, _ = replayed
    kernels = {k["kernel"]: k for k in report["calls"][0]["kernels"]}
    assert kernels["torch-math"]["status"] == "not_verified"
    assert kernels["model-output"]["error"]["rel_l2"] < 1e-6, kernels["model-output"]
