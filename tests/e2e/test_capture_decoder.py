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
