"""A decoder-only LLM as transformers serves it (tests/e2e/jobs/decoder_job.py: GQA, a left-padded
batch, greedy generate()), captured on the CPU and replayed: every call labelled with its layer and
step, the model's own output reproduced bit for bit by the backend it ran on every row that sees a
key, and the rows that see none (the pads) counted and left out of a second set of errors."""
import numpy as np
import pytest

from capture_common import read_calls, run_python_job, the_capture
from conftest import FAST, load_json, load_pt, run_attnreplay

LAYERS = 2
HEADS = 4


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("decoder")
    plain = folder / "plain.npz"
    captured = folder / "captured.npz"
    run_python_job("decoder_job.py", "--save", plain, preload=False)
    run_python_job("decoder_job.py", "--save", captured, out=folder / "caps")
    return folder, the_capture(folder / "caps"), plain, captured


def test_generation_is_unchanged_by_capture(decoder):
    _, _, plain, captured = decoder
    a, b = np.load(plain), np.load(captured)
    assert np.array_equal(a["tokens"], b["tokens"]) and np.array_equal(a["logits"], b["logits"])


def test_every_call_is_labelled_with_its_layer_and_step(decoder):
    _, capture, _, _ = decoder
    calls = read_calls(capture)
    # The forward pass for the logits, then generate(): a prefill and 3 decode steps, 2 layers each.
    assert len(calls) == LAYERS * 5
    for index, call in enumerate(calls):
        metadata = call["metadata"]
        assert (int(metadata["layer"]), int(metadata["step"])) == (index % LAYERS, index // LAYERS), metadata
        assert metadata["caller"] == "LlamaAttention"


def rows_seeing_a_key(mask, causal, shape):
    """(b, h, s_q) booleans from a bool mask broadcast as SDPA broadcasts it."""
    b, h, sq, skv = shape[0], shape[1], shape[2], mask.shape[-1]
    allowed = np.broadcast_to(mask, (b, h, sq, skv))
    if causal:
        allowed = allowed & np.tril(np.ones((sq, skv), dtype=bool))
    return allowed.any(axis=-1)


def test_the_models_backend_reproduces_its_output_and_the_pads_are_reported_apart(decoder):
    folder, capture, _, _ = decoder
    report = folder / "replay.json"
    outs = folder / "outs"
    run_attnreplay("run", capture, "--kernels", "reference,torch-flash-cpu", "--json", report, "--save-outputs",
                   outs, "-q", *FAST, check=0)
    record = load_json(report)
    calls = read_calls(capture)
    assert [c["call_index"] for c in record["calls"]] == [c["call_index"] for c in calls]
    padded_calls = 0
    for call, replayed in zip(calls, record["calls"]):
        assert replayed["backend"] == "aten::_scaled_dot_product_flash_attention_for_cpu"
        out = call["out"]
        sees = rows_seeing_a_key(call["mask"], call["is_causal"], out.shape)
        kernels = {k["kernel"]: k for k in replayed["kernels"]}
        flash = load_pt(outs / f"call{call['call_index']}_torch-flash-cpu.pt")["out"].numpy()
        # The backend the model ran gives the model's output exactly on every row that sees a key.
        assert np.array_equal(flash[sees], out[sees]), call["call_index"]
        model = kernels["model-output"]["error"]
        if sees.all():
            assert "no_key_rows" not in model
            assert model["rel_l2"] < 1e-6
            continue
        padded_calls += 1
        # The second prompt's 4 pads see no key in each of the 4 query heads.
        assert model["no_key_rows"] == int((~sees).sum()) == 4 * HEADS
        assert model["rel_l2"] < 1e-6, model  # over the rows that see a key
        assert kernels["torch-flash-cpu"]["error"]["rel_l2"] < 1e-6
    # The two passes over the padded prompt (the logits' forward and generate's prefill), 2 layers each.
    assert padded_calls == 2 * LAYERS


def test_a_padded_bf16_batch_runs_through_every_cpu_kernel_its_masks_read_as_structure(tmp_path):
    """Issue 72's CPU acceptance: our kernels' emulations take every call of a padded generate(),
    prefill and decode, their masks read as structure (formats/mask_structure.h)."""
    run_python_job("decoder_job.py", "--dtype", "bfloat16", "--head-dim", "64", out=tmp_path / "caps")
    capture = the_capture(tmp_path / "caps")
    report = tmp_path / "replay.json"
    run_attnreplay("run", capture, "--json", report, "-q", *FAST, check=0)
    record = load_json(report)
    assert len(record["calls"]) == LAYERS * 5
    cpu_kernels = set()
    for call in record["calls"]:
        # Decode steps' masks have one row (transformers folds GQA's query heads into seq_q).
        prefill = not call["mask"].split("x")[-2] == "1"
        expected = "causal + left padding, keys from 0/4" if prefill else "left padding, keys from 0/4"
        assert call["mask_structure"] == expected, call["mask_structure"]
        for kernel in call["kernels"]:
            if kernel["kernel"].endswith("-cpu") or kernel["kernel"] in ("torch-math", "reference"):
                cpu_kernels.add(kernel["kernel"])
                assert kernel["status"] not in ("not_supported", "failed"), kernel
            if kernel["kernel"] in ("flash", "sage1-int8", "sage2-int8-fp8", "fa3-fp8"):
                assert kernel["reason"] == "no CUDA device", kernel
    assert {"flash-cpu", "sage1-int8-cpu", "sage2-int8-fp8-cpu", "fa3-fp8-cpu"} <= cpu_kernels
