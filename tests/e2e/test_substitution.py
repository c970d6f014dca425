"""Kernel substitution under the preload (ATTNCAP_SUBSTITUTE) and `attnreplay e2e`, on real models on
the CPU: MiniLM (examples/run_minilm.py) and tiny diffusers Flux and CogVideoX transformers
(tests/e2e/jobs/diffusers_job.py), with no change to either.

- torch-math in place of SDPA gives the job's outputs within fp32 rounding;
- a quantized kernel's CPU emulation changes them, and `attnreplay e2e` says by how much (cosine,
  PSNR), with each substituted call's own error (checked here against numpy's exact attention)
  and how the error grows through the layers;
- a kernel that declines a call leaves it to the original op, and says so at exit;
- ATTNCAP_SUBSTITUTE_CALLS / _LAYERS restrict it; a capture beside it records which kernel gave
  each output.
"""

import json
import os
import subprocess

import numpy as np
import pytest

from capture_common import (BIN, JOBS, PYTHON, SDPA_JOB, SOURCE_DIR, attncap_lines, attnreplay, job_env, read_calls, run,
                            run_python_job, the_capture)

MINILM = SOURCE_DIR / "examples" / "run_minilm.py"
DIFFUSERS = JOBS / "diffusers_job.py"


def substitution_summary(stderr):
    lines = [line for line in attncap_lines(stderr) if "substitution by" in line or " left: " in line]
    assert lines, f"no substitution account at exit:\n{stderr}"
    return "\n".join(lines)


@pytest.fixture(scope="module")
def minilm_plain(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plain")
    run_python_job(MINILM, "--repeat", "2", "--save", folder / "emb.npy", preload=False)
    return np.load(folder / "emb.npy")


def test_minilm_under_torch_math_equals_the_job_as_is(minilm_plain, tmp_path):
    job = run_python_job(MINILM, "--repeat", "2", "--save", tmp_path / "emb.npy", ATTNCAP_SUBSTITUTE="torch-math")
    summary = substitution_summary(job.stderr)
    # torch-math computes on the job's own CPU tensors (and their padding mask): nothing is copied.
    assert "substitution by torch-math: 12 attention calls substituted (on the job's own tensors" in summary, summary
    assert "0 left to the original op" in summary, summary
    substituted = np.load(tmp_path / "emb.npy")
    # SDPA's CPU flash backend and its math backend sum in different orders: fp32 rounding apart.
    np.testing.assert_allclose(substituted, minilm_plain, rtol=0, atol=1e-6)
    # Substitution alone writes no capture.
    assert not any("capturing attention calls" in line for line in attncap_lines(job.stderr)), job.stderr


def test_tiny_diffusers_transformers_under_torch_math_equal_the_job_as_is(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "math").mkdir()
    counted = tmp_path / "sdpa.jsonl"
    run_python_job(DIFFUSERS, "--save-dir", tmp_path / "plain", "--count-sdpa", counted, preload=False)
    job = run_python_job(DIFFUSERS, "--save-dir", tmp_path / "math", ATTNCAP_SUBSTITUTE="torch-math")
    calls = len(counted.read_text().splitlines())
    assert calls == 6
    assert f"{calls} attention calls substituted" in substitution_summary(job.stderr)
    for model in ("flux", "cogvideox"):
        plain, math = np.load(tmp_path / "plain" / f"{model}.npy"), np.load(tmp_path / "math" / f"{model}.npy")
        np.testing.assert_allclose(math, plain, rtol=1e-5, atol=1e-5, err_msg=model)


def test_a_kernel_that_declines_leaves_the_call_to_the_op_and_says_why(minilm_plain, tmp_path):
    # The quantized emulations take bf16/fp16 inputs; MiniLM runs in fp32.
    job = run_python_job(MINILM, "--repeat", "2", "--save", tmp_path / "emb.npy", ATTNCAP_SUBSTITUTE="sage2-int8-fp8-cpu")
    summary = substitution_summary(job.stderr)
    assert "0 attention calls substituted" in summary and "12 left to the original op" in summary, summary
    assert "12 left: needs bfloat16 or float16 inputs, got float32" in summary, summary
    np.testing.assert_array_equal(np.load(tmp_path / "emb.npy"), minilm_plain)


def test_layer_and_call_ranges_restrict_substitution_and_the_capture_says_which_kernel_ran(tmp_path):
    job = run_python_job(MINILM, "--repeat", "2", "--dtype", "bfloat16", out=tmp_path / "caps",
                         ATTNCAP_SUBSTITUTE="sage1-int8-cpu", ATTNCAP_SUBSTITUTE_LAYERS="2-3")
    summary = substitution_summary(job.stderr)
    assert "4 attention calls substituted" in summary and "8 left: outside ATTNCAP_SUBSTITUTE_LAYERS" in summary, summary
    # An emulation takes host tensors: its calls go through copies.
    assert "substituted (through host copies" in summary, summary
    calls = read_calls(the_capture(tmp_path / "caps"))
    assert len(calls) == 12
    for c in calls:
        meta = c["metadata"]
        if meta["layer"] in ("2", "3"):
            assert meta.get("substituted_by") == "sage1-int8-cpu", meta
        else:
            assert "substituted_by" not in meta and meta.get("substitution_left") == "outside ATTNCAP_SUBSTITUTE_LAYERS"

    job = run_python_job(MINILM, "--repeat", "2", "--dtype", "bfloat16", ATTNCAP_SUBSTITUTE="sage1-int8-cpu",
                         ATTNCAP_SUBSTITUTE_CALLS="0-2,11")
    summary = substitution_summary(job.stderr)
    assert "4 attention calls substituted" in summary and "8 left: outside ATTNCAP_SUBSTITUTE_CALLS" in summary, summary

    # The second encoding is step 1: only its six calls.
    job = run_python_job(MINILM, "--repeat", "2", "--dtype", "bfloat16", out=tmp_path / "steps",
                         ATTNCAP_SUBSTITUTE="sage1-int8-cpu", ATTNCAP_SUBSTITUTE_STEPS="1")
    summary = substitution_summary(job.stderr)
    assert "6 attention calls substituted" in summary and "6 left: outside ATTNCAP_SUBSTITUTE_STEPS" in summary, summary
    substituted = [c["metadata"]["step"] for c in read_calls(the_capture(tmp_path / "steps"))
                   if "substituted_by" in c["metadata"]]
    assert substituted == ["1"] * 6


def test_a_python_plug_in_kernel_substitutes_in_the_jobs_own_interpreter(minilm_plain, tmp_path):
    plugin = SOURCE_DIR / "examples" / "plugins" / "chunked_sdpa.py"
    job = run_python_job(MINILM, "--repeat", "2", "--save", tmp_path / "emb.npy", ATTNCAP_SUBSTITUTE="chunked-sdpa",
                         ATTNCAP_KERNEL_MODULE=plugin)
    summary = substitution_summary(job.stderr)
    assert "substitution by chunked-sdpa: 12 attention calls substituted (on the job's own tensors" in summary, summary
    np.testing.assert_allclose(np.load(tmp_path / "emb.npy"), minilm_plain, rtol=0, atol=1e-6)

    # A name neither built in nor defined in Python: said once, every call left to its op.
    job = run_python_job(MINILM, "--repeat", "2", "--save", tmp_path / "none.npy", ATTNCAP_SUBSTITUTE="chunked-sdpb",
                         ATTNCAP_KERNEL_MODULE=plugin)
    lines = "\n".join(attncap_lines(job.stderr))
    assert lines.count("ATTNCAP_SUBSTITUTE=chunked-sdpb: no kernel named 'chunked-sdpb'") == 1, lines
    assert "12 left: no kernel named 'chunked-sdpb'" in lines, lines
    np.testing.assert_array_equal(np.load(tmp_path / "none.npy"), minilm_plain)


def test_calls_substituted_on_the_jobs_tensors_are_captured_whole(tmp_path):
    """A kernel that computes on the job's own tensors reads no host copy, but a capture beside it
    still records every tensor: the first call's inputs and mask as a capture without substitution
    has them, and its output within fp32 rounding of the op's."""
    run_python_job(MINILM, "--repeat", "1", out=tmp_path / "plain")
    job = run_python_job(MINILM, "--repeat", "1", out=tmp_path / "math", ATTNCAP_SUBSTITUTE="torch-math")
    assert "6 attention calls substituted (on the job's own tensors" in substitution_summary(job.stderr)
    plain, math = (read_calls(the_capture(tmp_path / name)) for name in ("plain", "math"))
    assert len(plain) == len(math) == 6
    assert all(c["metadata"]["substituted_by"] == "torch-math" for c in math)
    first, first_math = plain[0], math[0]
    for name in ("q", "k", "v", "mask"):
        assert first[name] is not None and first[name].size > 0, name
        np.testing.assert_array_equal(first_math[name], first[name], err_msg=name)
    np.testing.assert_allclose(first_math["out"], first["out"], rtol=0, atol=1e-6)


def sdpa_job_outputs(path):
    """tests/programs/sdpa_job's three outputs: fp32 (2,4,24,16), bf16 (2,4,24,16), fp32 (1,8,10,32)."""
    raw = path.read_bytes()
    first = np.frombuffer(raw, np.float32, 2 * 4 * 24 * 16)
    bf16 = np.frombuffer(raw, np.uint16, 2 * 4 * 24 * 16, offset=first.nbytes)
    second = (bf16.astype(np.uint32) << 16).view(np.float32)
    third = np.frombuffer(raw, np.float32, offset=first.nbytes + bf16.nbytes)
    return first, second, third


def test_a_cpp_libtorch_job_is_substituted_without_python(tmp_path):
    run([SDPA_JOB, tmp_path / "plain.bin"], job_env(preload=False))
    job = run([SDPA_JOB, tmp_path / "math.bin"], job_env(ATTNCAP_SUBSTITUTE="torch-math"))
    assert "3 attention calls substituted" in substitution_summary(job.stderr)
    plain, math = sdpa_job_outputs(tmp_path / "plain.bin"), sdpa_job_outputs(tmp_path / "math.bin")
    for a, b, tolerance in zip(math, plain, (1e-6, 1e-2, 1e-6)):
        np.testing.assert_allclose(a, b, rtol=0, atol=tolerance)
    # Python kernels need a Python job: said at start, and the job runs as is.
    job = run([SDPA_JOB, tmp_path / "py.bin"], job_env(ATTNCAP_SUBSTITUTE="chunked-sdpa"))
    assert "ATTNCAP_SUBSTITUTE=chunked-sdpa is off, and the job runs unsubstituted: no kernel named" in job.stderr
    assert (tmp_path / "py.bin").read_bytes() == (tmp_path / "plain.bin").read_bytes()


def test_attention_time_is_said_at_exit_and_nothing_is_captured_for_it(tmp_path):
    job = run_python_job(MINILM, "--repeat", "2", "--save", tmp_path / "emb.npy", ATTNCAP_TIME_ATTENTION="1")
    (line,) = [line for line in attncap_lines(job.stderr) if "attention took" in line]
    seconds = float(line.split("attention took ")[1].split(" s of wall time over 12 calls")[0])
    assert 0 < seconds < 10, line
    assert not any("capturing attention calls" in line for line in attncap_lines(job.stderr)), job.stderr


def stand_in_job(job, folder, name, **attncap):
    """A stand-in job's outputs (tests/e2e/jobs/), as is or substituted, and its stderr."""
    result = run_python_job(job, "--save", folder / f"{name}.npz", preload=bool(attncap), **attncap)
    outputs = np.load(folder / f"{name}.npz")
    return {key: outputs[key] for key in outputs.files}, result.stderr


def test_torch_compile_calls_the_backend_op_which_is_substituted_after_it_runs(tmp_path):
    # Inductor's code calls SDPA's CPU backend op, which returns the log-sum-exp too: the op runs,
    # and its output is then the kernel's.
    run_python_job("compile_job.py", "--save", tmp_path / "plain.npy", preload=False)
    job = run_python_job("compile_job.py", "--save", tmp_path / "ref.npy", ATTNCAP_SUBSTITUTE="reference")
    summary = substitution_summary(job.stderr)
    assert "3 attention calls substituted" in summary and "0 left" in summary, summary
    np.testing.assert_allclose(np.load(tmp_path / "ref.npy"), np.load(tmp_path / "plain.npy"), rtol=0, atol=1e-6)


def test_ops_registered_after_start_are_substituted_and_their_extensions_honoured_or_refused(tmp_path):
    # flash-attn's forward op under its own name and schema, registered when the job imports it.
    plain, _ = stand_in_job("flash_attn_op_job.py", tmp_path, "plain")
    exact, stderr = stand_in_job("flash_attn_op_job.py", tmp_path, "exact", ATTNCAP_SUBSTITUTE="reference")
    assert "5 attention calls substituted" in substitution_summary(stderr)
    for name in plain:
        np.testing.assert_allclose(exact[name], plain[name], rtol=0, atol=1e-6, err_msg=name)
    # torch-math computes windows, not softcaps or ALiBi: those calls keep the op's own output.
    math, stderr = stand_in_job("flash_attn_op_job.py", tmp_path, "math", ATTNCAP_SUBSTITUTE="torch-math")
    summary = substitution_summary(stderr)
    assert "2 attention calls substituted" in summary and "3 left to the original op" in summary, summary
    assert "1 left: the call has a softcap of 30, which this kernel does not compute" in summary, summary
    assert "1 left: the call has ALiBi slopes, which this kernel does not compute" in summary, summary


def test_ragged_and_paged_batches_are_substituted_sequence_by_sequence(tmp_path):
    # flash-attn's varlen and FlashAttention-3's ops: packed and paged batches; torch's CPU flash
    # backend takes one dense sequence at a time (kernels/per_sequence.h).
    plain, _ = stand_in_job("flash_attn_varlen_job.py", tmp_path, "plain")
    flash, stderr = stand_in_job("flash_attn_varlen_job.py", tmp_path, "flash", ATTNCAP_SUBSTITUTE="torch-flash-cpu")
    summary = substitution_summary(stderr)
    assert "5 attention calls substituted" in summary, summary
    assert "through host copies" in summary, summary  # a packed batch is cut into sequences on the host
    assert "1 left: the call has a softcap of 20, which this kernel does not compute" in summary, summary
    assert "(keys appended to a KV cache)" in summary, summary  # not a record replay can honour
    for name in plain:
        np.testing.assert_allclose(flash[name], plain[name], rtol=0, atol=1e-5, err_msg=name)
    assert any(not np.array_equal(flash[name], plain[name]) for name in plain)  # the kernel's, not the op's


def test_python_entry_points_are_substituted_after_they_return(tmp_path):
    # FlashInfer's wrappers and functions and flash_attn_with_kvcache, as stand-ins under their real
    # names and signatures (computing in fp64): each output they return is overwritten in place.
    plain, _ = stand_in_job("python_entry_points_job.py", tmp_path, "plain")
    exact, stderr = stand_in_job("python_entry_points_job.py", tmp_path, "exact", ATTNCAP_SUBSTITUTE="reference")
    summary = substitution_summary(stderr)
    # flash_attn_with_kvcache's appended keys are in the cache once it has run, where the record reads
    # them: that call is substituted too. FlashInfer's fp16 Q·K reduction is not a record's.
    assert "9 attention calls substituted (through host copies" in summary and "1 left" in summary, summary
    assert "1 left: the call has use_fp16_qk_reduction=True" in summary, summary
    for name in plain:  # the fp64 reference in fp16, as the stand-ins round theirs
        np.testing.assert_allclose(exact[name], plain[name], rtol=0, atol=1e-3, err_msg=name)
    # torch-math computes no softcap or sinks: those calls keep the function's own output; the others
    # are torch's, which in fp16 mostly round as the stand-ins' fp64 does, but not everywhere.
    math, stderr = stand_in_job("python_entry_points_job.py", tmp_path, "math", ATTNCAP_SUBSTITUTE="torch-math",
                                ATTNCAP_OUT=tmp_path / "caps")
    summary = substitution_summary(stderr)
    assert "6 attention calls substituted" in summary and "4 left" in summary, summary
    # A capture beside it records the output the job got: the kernel's where it was substituted.
    calls = read_calls(the_capture(tmp_path / "caps"))
    assert len(calls) == len(plain) == 10
    for name, call in zip(plain, calls):
        np.testing.assert_array_equal(call["out"].reshape(math[name].shape), math[name], err_msg=name)
        assert ("substituted_by" in call["metadata"]) == (name not in ("decode_softcap", "decode_hnd_window_sinks",
                                                                         "kvcache_paged_window", "fp16_qk_reduction"))
    assert "1 left: the call has attention sinks, which this kernel does not compute" in summary, summary
    assert not np.array_equal(math["prefill_paged_causal"], plain["prefill_paged_causal"])
    np.testing.assert_allclose(math["prefill_paged_causal"], plain["prefill_paged_causal"], rtol=0, atol=1e-3)


def test_bad_substitution_settings_are_said_and_the_job_runs_on(minilm_plain, tmp_path):
    job = run_python_job(MINILM, "--repeat", "2", "--save", tmp_path / "a.npy", ATTNCAP_SUBSTITUTE="no-such-kernel")
    lines = "\n".join(attncap_lines(job.stderr))
    assert "ATTNCAP_SUBSTITUTE=no-such-kernel: no kernel named 'no-such-kernel'" in lines, lines
    assert "torch-math" in lines  # the kernels it could have named
    assert "12 left: no kernel named 'no-such-kernel'" in lines, lines
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), minilm_plain)

    job = run_python_job(MINILM, "--save", tmp_path / "b.npy", ATTNCAP_SUBSTITUTE_LAYERS="1-2")
    assert "ATTNCAP_SUBSTITUTE_LAYERS is set, but ATTNCAP_SUBSTITUTE is not" in job.stderr, job.stderr
    job = run_python_job(MINILM, "--save", tmp_path / "c.npy", ATTNCAP_SUBSTITUTE="torch-math",
                         ATTNCAP_SUBSTITUTE_STEPS="x")
    assert "ATTNCAP_SUBSTITUTE_STEPS='x': expected ranges like 0-40,55" in job.stderr, job.stderr


# ---------------------------------------------------------------------------------------------
# attnreplay e2e


def exact_attention(c):
    """numpy's exact attention of a captured SDPA call, in float64: what the reference computes."""
    q, k, v = (c[name].astype(np.float64) for name in ("q", "k", "v"))
    scale = c["scale"] if c["scale"] is not None else 1 / np.sqrt(q.shape[-1])
    scores = q @ np.swapaxes(k, -1, -2) * scale
    if c["mask"] is not None:
        mask = c["mask"]
        scores = np.where(mask, scores, -np.inf) if mask.dtype == bool else scores + mask.astype(np.float64)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    return (p / p.sum(axis=-1, keepdims=True)) @ v


@pytest.fixture(scope="module")
def minilm_e2e(tmp_path_factory):
    folder = tmp_path_factory.mktemp("e2e")
    emb = folder / "emb.npy"
    result = attnreplay("e2e", "--kernel", "sage2-int8-fp8-cpu", "--outputs", emb, "--workdir", folder / "runs",
                        "--json", folder / "e2e.json", "--", PYTHON, MINILM, "--repeat", "2", "--dtype", "bfloat16",
                        "--save", emb, timeout=600)
    return dict(folder=folder, result=result, record=json.loads((folder / "e2e.json").read_text()))


def test_e2e_reports_how_far_the_quantized_kernel_moves_the_embeddings(minilm_e2e):
    record, folder = minilm_e2e["record"], minilm_e2e["folder"]
    original, substituted = record["runs"]
    assert substituted["substitution"]["substituted"] == 12 and substituted["substitution"]["left"] == 0
    assert substituted["substitution"]["substituted_where"] == "through host copies"  # an emulation's
    assert substituted["substitution"]["substituted_time"].endswith(" s")
    assert original["attention_calls"] == substituted["attention_calls"] == 12  # the preload's clock
    assert original["attention_s"] > 0 and substituted["attention_s"] > 0
    assert original["wall_s"] > 0 and substituted["wall_s"] > 0
    (entry,) = record["outputs"][0]["tensors"]
    # The figures, recomputed from the two runs' files.
    a = np.load(folder / "runs" / "original" / "outputs" / "emb.npy").astype(np.float64)
    b = np.load(folder / "runs" / "substituted" / "outputs" / "emb.npy").astype(np.float64)
    d = entry["distance"]
    assert d["rel_l2"] == pytest.approx(np.linalg.norm(b - a) / np.linalg.norm(a), rel=1e-9)
    assert d["cosine"] == pytest.approx((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b), rel=1e-12)
    mse = ((b - a) ** 2).mean()
    assert d["psnr_db"] == pytest.approx(20 * np.log10(np.abs(a).max() / np.sqrt(mse)), rel=1e-9)
    assert 0.99 < d["cosine"] < 1 - 1e-6  # changed, not broken
    out = minilm_e2e["result"].stdout
    assert "sage2-int8-fp8-cpu substituted into" in out and "PSNR" in out and "per layer" in out, out


def test_e2e_per_call_errors_equal_numpys_and_show_the_error_growing_through_layers(minilm_e2e):
    record, folder = minilm_e2e["record"], minilm_e2e["folder"]
    substituted = read_calls(the_capture(folder / "runs" / "substituted" / "capture"))
    original = read_calls(the_capture(folder / "runs" / "original" / "capture"))
    by_index = {c["call_index"]: c for c in record["calls"]}
    for s, o in zip(substituted, original):
        entry = by_index[s["call_index"]]
        assert entry["substituted_by"] == "sage2-int8-fp8-cpu"
        exact = exact_attention(s)
        own = np.linalg.norm(s["out"] - exact) / np.linalg.norm(exact)
        assert entry["own_rel_l2"] == pytest.approx(own, rel=1e-6), entry
        # MiniLM pads its batch on the right: every query row sees a key, so the queries are compared whole.
        queries = np.linalg.norm(s["q"].astype(np.float64) - o["q"]) / np.linalg.norm(o["q"].astype(np.float64))
        assert entry["input_rel_l2"] == pytest.approx(queries, rel=1e-9, abs=1e-15), entry
    layers = record["layers"]  # through the first step's layers
    assert record["layers_step"] == 0 and [layer["layer"] for layer in layers] == list(range(6))
    assert all(layer["calls"] == 1 and layer["substituted"] == 1 for layer in layers)
    assert [(step["step"], step["calls"]) for step in record["steps"]] == [(0, 6), (1, 6)]
    # Layer 0 sees the model's own inputs; every later one inputs the kernel has already moved.
    assert layers[0]["input_rel_l2"] == 0
    assert all(layer["input_rel_l2"] > 0 for layer in layers[1:])
    assert layers[-1]["input_rel_l2"] > layers[1]["input_rel_l2"]
    assert all(1e-3 < layer["own_rel_l2"] < 0.1 for layer in layers)


def test_e2e_on_a_diffusers_transformer_reports_the_latents_psnr(tmp_path):
    # Without "--": the job's command starts at its first word, its own flags its own.
    result = attnreplay("e2e", "--kernel", "sage1-int8-cpu", "--outputs", tmp_path / "flux.npy", "--workdir",
                        tmp_path / "runs", "--json", tmp_path / "e2e.json", PYTHON, DIFFUSERS, "--models", "flux",
                        "--dtype", "bfloat16", "--save-dir", tmp_path, timeout=600)
    record = json.loads((tmp_path / "e2e.json").read_text())
    assert record["runs"][1]["substitution"]["substituted"] == 4
    d = record["outputs"][0]["tensors"][0]["distance"]
    assert isinstance(d["psnr_db"], float) and 10 < d["psnr_db"] < 80, d
    assert "flux.npy [1x16x4] float32" in result.stdout, result.stdout


def test_e2e_errors_name_the_run_and_the_file(tmp_path):
    missing = attnreplay("e2e", "--kernel", "torch-math", "--outputs", tmp_path / "never.npy", "--workdir",
                         tmp_path / "runs", "--no-layers", "--", PYTHON, MINILM, check=None)
    assert missing.returncode != 0 and "the original run did not write" in missing.stderr, missing.stderr
    assert "never.npy" in missing.stderr and "Traceback" not in missing.stderr
    failing = attnreplay("e2e", "--kernel", "torch-math", "--workdir", tmp_path / "runs2", "--no-layers", "--", PYTHON,
                         "-c", "import sys; sys.exit(3)", check=None)
    assert failing.returncode != 0 and "the original run of" in failing.stderr and "exited with 3" in failing.stderr
    # A kernel that substitutes nothing (here: no such kernel) is said, with the preload's reason.
    unknown = attnreplay("e2e", "--kernel", "no-such-kernel", "--workdir", tmp_path / "runs3", "--no-layers", "--",
                         PYTHON, MINILM, check=0)
    assert "no-such-kernel substituted no call" in unknown.stdout, unknown.stdout
    assert "6 left: no kernel named 'no-such-kernel'" in unknown.stdout, unknown.stdout


IMAGE_JOB = r"""
import os, sys
import numpy as np
import torch  # noqa: F401 - a job with torch, as a diffusers pipeline is: the preload acts in it
from PIL import Image
rng = np.random.default_rng(0)
image = rng.integers(0, 256, (48, 64, 3)).astype(np.int16)
if os.environ.get("ATTNCAP_SUBSTITUTE"):  # the substituted run draws a slightly different picture
    image += rng.integers(-6, 7, image.shape).astype(np.int16)
image = np.clip(image, 0, 255).astype(np.uint8)
Image.fromarray(image).save(sys.argv[1] + ".png")
Image.fromarray(image).save(sys.argv[1] + ".jpg", quality=90)
open(sys.argv[1] + "-broken.png", "wb").write(open(sys.argv[1] + ".png", "rb").read()[:60])
"""


def test_e2e_reads_png_and_jpeg_images(tmp_path):
    from PIL import Image

    job = tmp_path / "image_job.py"
    job.write_text(IMAGE_JOB)
    stem = tmp_path / "img"
    png, jpg = tmp_path / "img.png", tmp_path / "img.jpg"
    attnreplay("e2e", "--kernel", "torch-math", "--outputs", png, jpg, "--workdir", tmp_path / "runs", "--no-layers",
               "--json", tmp_path / "e2e.json", "--", PYTHON, job, stem)
    record = json.loads((tmp_path / "e2e.json").read_text())
    assert sorted(saved["output"] for saved in record["outputs"]) == sorted(map(str, (jpg, png)))
    for saved in record["outputs"]:
        name = saved["output"].rsplit("/", 1)[-1]
        (tensor,) = saved["tensors"]
        a = np.asarray(Image.open(tmp_path / "runs" / "original" / "outputs" / name)).astype(np.float64)
        b = np.asarray(Image.open(tmp_path / "runs" / "substituted" / "outputs" / name)).astype(np.float64)
        assert tensor["dtype"] == "uint8" and tensor["shape"] == [48, 64, 3], tensor
        # PSNR as e2e defines it (the largest value as is over the RMS difference), from PIL's pixels.
        psnr = 20 * np.log10(np.abs(a).max() / np.sqrt(np.mean((a - b) ** 2)))
        assert abs(tensor["distance"]["psnr_db"] - psnr) < 1e-6, (name, tensor["distance"], psnr)
        assert 0 < tensor["distance"]["ssim"] < 1, (name, tensor)

    # An image cut short is named, with the reason, and nothing is thrown at the user.
    broken = tmp_path / "img-broken.png"
    broken.unlink()  # the first e2e's jobs wrote it too
    result = attnreplay("e2e", "--kernel", "torch-math", "--outputs", broken, "--workdir", tmp_path / "runs2",
                        "--no-layers", "--", PYTHON, job, stem, check=None)
    assert result.returncode != 0 and "img-broken.png: " in result.stderr and "libpng" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_e2e_keeps_the_callers_preloads_after_its_own(tmp_path):
    libm = next(p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6")
                if os.path.exists(p))
    result = subprocess.run([BIN, "e2e", "--kernel", "torch-math", "--workdir", tmp_path / "runs", "--no-layers", "--",
                             PYTHON, "-c", "import os, torch; print(os.environ['LD_PRELOAD'])"],
                            env=dict(os.environ, LD_PRELOAD=libm), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for run_name in ("original", "substituted"):
        preloads = (tmp_path / "runs" / run_name / "stdout.txt").read_text().strip().split(":")
        assert preloads[0].endswith("libattncap.so") and preloads[1:] == [libm], preloads


def test_e2e_on_a_left_padded_decoder_compares_tokens_logits_and_leaves_the_pads_out(tmp_path):
    decoder = JOBS / "decoder_job.py"
    saved = tmp_path / "dec.pt"  # a dict torch.save wrote: tokens and logits
    attnreplay("e2e", "--kernel", "sage2-int8-fp8-cpu", "--outputs", saved, "--workdir", tmp_path / "runs", "--json",
               tmp_path / "e2e.json", "--", PYTHON, decoder, "--dtype", "bfloat16", "--head-dim", "64", "--save", saved,
               timeout=600)
    record = json.loads((tmp_path / "e2e.json").read_text())
    tensors = {t["tensor"]: t for t in record["outputs"][0]["tensors"]}
    assert set(tensors) == {"tokens", "logits"}
    assert tensors["tokens"]["dtype"] == "int64" and "logits" not in tensors["tokens"]
    logits = tensors["logits"]["logits"]
    assert logits["rows"] == 24 and 0.5 <= logits["top1_agreement"] <= 1 and logits["mean_kl"] > 0
    # The second prompt's four pads see no key: they are left out of each call's figures.
    padded = [c for c in record["calls"] if c.get("rows_without_a_key")]
    assert padded, record["calls"]
    assert all(c["substituted_by"] == "sage2-int8-fp8-cpu" and 1e-3 < c["own_rel_l2"] < 0.1 for c in padded), padded
