"""Capture (LD_PRELOAD=libattncap.so) on real PyTorch jobs: MiniLM, tiny diffusers transformers,
torch.compile, SDPA's argument variants, training with backward, nn.MultiheadAttention.

Every job is a plain torch program (examples/run_minilm.py, tests/e2e/jobs/*.py) run as a
subprocess, once without the preload and once with it; results must not change by a single bit.
"""

import json
import math
import os

import numpy as np
import pytest

from capture_common import (FAST, SOURCE_DIR, attncap_lines, attnreplay, read_calls, run_python_job, summary,
                            the_capture)

CPU_FLASH = "aten::_scaled_dot_product_flash_attention_for_cpu"
SDPA = "aten::scaled_dot_product_attention"


def bits(array):
    """Bytes of a value array, for bit-for-bit comparison (NaN-safe, -0.0 != 0.0)."""
    return np.ascontiguousarray(array).tobytes()


# The attnreplay kernel that runs each backend op the model can have used on the CPU.
KERNEL_OF_BACKEND = {CPU_FLASH: "torch-flash-cpu", "aten::_scaled_dot_product_attention_math": "torch-math"}


def assert_replay_reproduces_captured_out(path, tmp_path, indices=None):
    """Replays the capture's calls (all, or `indices`) through the kernel of the backend each call
    ran, from the captured tensors, and requires the model's own output bit for bit."""
    import torch

    calls = [c for c in read_calls(path, as_torch=True) if indices is None or c["call_index"] in indices]
    assert calls
    for kernel in sorted({KERNEL_OF_BACKEND[c["backend"]] for c in calls}):
        wanted = [c for c in calls if KERNEL_OF_BACKEND[c["backend"]] == kernel]
        ranges = ",".join(str(c["call_index"]) for c in wanted)
        out_dir = tmp_path / kernel
        attnreplay("run", path, "--kernels", kernel, "--calls", ranges, "--save-outputs", out_dir, "-q", *FAST)
        for c in wanted:
            saved = torch.load(out_dir / f"call{c['call_index']}_{kernel}.pt", weights_only=True)
            replayed = saved["out"] if isinstance(saved, dict) else saved
            assert replayed.shape == c["out"].shape, (c["call_index"], replayed.shape, c["out"].shape)
            assert bits(replayed.contiguous().numpy()) == bits(c["out"].contiguous().numpy()), \
                f"call {c['call_index']} through {kernel}: max diff {(replayed - c['out']).abs().max().item()}"


# ---------------------------------------------------------------------------------------------
# (a) MiniLM: 4 sentences, encoded twice, 6 layers -> 12 SDPA calls.


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("minilm")
    script = SOURCE_DIR / "examples" / "run_minilm.py"
    plain = run_python_job(script, "--repeat", "2", "--save", folder / "plain.npy", preload=False)
    captured = run_python_job(script, "--repeat", "2", "--save", folder / "captured.npy", out=folder / "caps")
    path = the_capture(folder / "caps")
    return dict(folder=folder, plain=plain, captured=captured, path=path, calls=read_calls(path))


def test_minilm_twice_encoded_batch_gives_12_sdpa_calls(minilm):
    # 6 BERT layers x 2 encodings; a miss or a double count (outer op and its backend) fails here.
    calls = minilm["calls"]
    assert [c["call_index"] for c in calls] == list(range(12)), attncap_lines(minilm["captured"].stderr)
    assert {c["op"] for c in calls} == {SDPA}
    assert {c["backend"] for c in calls} == {CPU_FLASH}  # the inner op that really ran


def test_minilm_calls_hold_the_models_tensors_and_arguments(minilm):
    for c in minilm["calls"]:
        where = f"call {c['call_index']}"
        for name in ("q", "k", "v", "out"):
            assert c["dtypes"][name] == "float32", where
            assert c[name].shape == (4, 12, 21, 32), where  # batch 4, 12 heads, 21 tokens, head dim 32
        # BERT views (b, s, h*d) as (b, s, h, d) and transposes: non-contiguous (b, h, s, d) tensors
        # whose strides must be the model's, not those of a contiguous copy.
        for name in ("q", "k", "v"):
            assert c["strides"][name] == (21 * 384, 32, 384, 1), where
        assert c["dtypes"]["mask"] == "bool" and c["mask"].shape == (4, 1, 21, 21), where
        assert not c["mask"].all(), f"{where}: padding of the short sentences must be masked out"
        # transformers passes scale=head_dim**-0.5 explicitly: recorded, not left as default (None).
        assert c["scale"] is not None and c["scale"] == pytest.approx(1 / math.sqrt(32), rel=1e-12), where
        assert c["is_causal"] is False and c["dropout_p"] == 0.0 and c["enable_gqa"] is False, where


def test_minilm_step_layer_and_call_site_metadata(minilm):
    for c in minilm["calls"]:
        i, meta = c["call_index"], c["metadata"]
        # Each BertSelfAttention object is a layer; the first one appearing again starts step 1.
        assert (meta.get("step"), meta.get("layer")) == (str(i // 6), str(i % 6)), meta
        assert "/transformers/" in meta.get("call_site", ""), meta


def test_layers_and_call_sites_when_packages_live_under_a_folder_named_torch(tmp_path):
    # As on a machine whose venv is /opt/torch/.venv: every installed package's path holds
    # "/torch/". Only torch's own package is torch's code; transformers' frames still name the
    # call site and tell the layers apart.
    import transformers

    packages = tmp_path / "torch" / "site"
    packages.mkdir(parents=True)
    (packages / "transformers").symlink_to(os.path.dirname(transformers.__file__))
    script = SOURCE_DIR / "examples" / "run_minilm.py"
    job = run_python_job(script, "--repeat", "2", out=tmp_path / "caps", PYTHONPATH=packages)
    calls = read_calls(the_capture(tmp_path / "caps"))
    assert len(calls) == 12, attncap_lines(job.stderr)
    for c in calls:
        i, meta = c["call_index"], c["metadata"]
        assert (meta.get("step"), meta.get("layer")) == (str(i // 6), str(i % 6)), meta
        assert f"{packages}/transformers/" in meta.get("call_site", ""), meta


def test_minilm_embeddings_bit_identical_with_capture(minilm):
    plain, captured = np.load(minilm["folder"] / "plain.npy"), np.load(minilm["folder"] / "captured.npy")
    assert plain.shape == captured.shape == (2, 4, 384)
    assert bits(plain) == bits(captured)
    assert minilm["plain"].stdout == minilm["captured"].stdout


def test_minilm_replay_through_torch_flash_cpu_is_bit_identical_to_captured_out(minilm, tmp_path):
    # Same kernel, same inputs (strides restored): the replayed output must be the model's, exactly.
    import torch

    attnreplay("run", minilm["path"], "--kernels", "torch-flash-cpu", "--save-outputs", tmp_path, "-q", *FAST)
    captured = read_calls(minilm["path"], as_torch=True)
    assert len(captured) == 12
    for c in captured:
        saved = torch.load(tmp_path / f"call{c['call_index']}_torch-flash-cpu.pt", weights_only=True)
        replayed = saved["out"] if isinstance(saved, dict) else saved
        assert replayed.dtype == c["out"].dtype and replayed.shape == c["out"].shape, c["call_index"]
        assert bits(replayed.contiguous().numpy()) == bits(c["out"].contiguous().numpy()), \
            f"call {c['call_index']}: max diff {(replayed - c['out']).abs().max().item()}"


def test_minilm_capture_audits_through_the_quantized_emulations(minilm, tmp_path):
    # The real model's calls (fp32, with BERT's padding mask) through every emulation, cast to bf16:
    # all 12 calls judged, none declined, each kind's median error in its band.
    kernels = ["flash-cpu", "sage1-int8-cpu", "sage2-int8-fp8-cpu", "fa3-fp8-cpu"]
    out = tmp_path / "audit.json"
    attnreplay("audit", minilm["path"], "--kernels", ",".join(kernels), "--cast-inputs", "bf16", "--json", out, *FAST)
    audit = {k["kernel"]: k for k in json.loads(out.read_text())["kernels"]}
    bands = {"flash-cpu": 0.003, "sage1-int8-cpu": 0.02, "sage2-int8-fp8-cpu": 0.05, "fa3-fp8-cpu": 0.07}
    for kernel in kernels:
        k = audit[kernel]
        assert (k["verdict"], k["calls_judged"], k["calls_not_supported"]) == ("passed", 12, 0), k
        assert k["errors"]["rel_l2"]["median"] <= bands[kernel], (kernel, k["errors"]["rel_l2"])


def test_minilm_capture_replays_through_a_python_plug_in(minilm, tmp_path):
    # The README demo's plug-in on the real model's calls (fp32, a bool padding mask, the model's
    # strides): every call judged against the reference and passing fp32's thresholds.
    out = tmp_path / "r.json"
    plugin = SOURCE_DIR / "examples" / "plugins" / "chunked_sdpa.py"
    attnreplay("run", minilm["path"], "--kernel-module", plugin, "--kernels", "chunked-sdpa,torch-math", "--refcheck",
               "--json", out, "-q", *FAST)
    calls = json.loads(out.read_text())["calls"]
    assert len(calls) == 12
    for call in calls:
        row = {k["kernel"]: k for k in call["kernels"]}["chunked-sdpa"]
        assert row["status"] == "passed", (call["call_index"], row["reason"])
        assert row["kernel_source"] == str(plugin)


# ---------------------------------------------------------------------------------------------
# (b) diffusers transformers with tiny configs and seeded random weights.


@pytest.fixture(scope="module")
def diffusers_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("diffusers")
    (folder / "plain").mkdir()
    (folder / "captured").mkdir()
    # The reference run counts F.scaled_dot_product_attention calls by wrapping it, without preload.
    run_python_job("diffusers_job.py", "--save-dir", folder / "plain", "--count-sdpa", folder / "sdpa.jsonl",
                   preload=False)
    captured = run_python_job("diffusers_job.py", "--save-dir", folder / "captured", out=folder / "caps")
    counted = [json.loads(line) for line in (folder / "sdpa.jsonl").read_text().splitlines()]
    return dict(folder=folder, captured=captured, counted=counted, calls=read_calls(the_capture(folder / "caps")))


def test_diffusers_every_attention_call_is_captured_once(diffusers_run):
    counted, calls = diffusers_run["counted"], diffusers_run["calls"]
    # Flux: 2 joint + 2 single blocks; CogVideoX: 2 blocks (the counts come from the wrapped run).
    assert [c["model"] for c in counted] == ["flux"] * 4 + ["cogvideox"] * 2
    assert len(calls) == len(counted), attncap_lines(diffusers_run["captured"].stderr)
    assert {c["op"] for c in calls} == {SDPA}


def test_diffusers_captured_shapes_match_the_models_calls(diffusers_run):
    for want, c in zip(diffusers_run["counted"], diffusers_run["calls"]):
        got = {name: list(c[name].shape) for name in ("q", "k", "v")}
        assert got == {name: want[name] for name in ("q", "k", "v")}, (want["model"], c["call_index"])
        assert list(c["out"].shape) == want["q"][:3] + [want["v"][3]]
        assert c["dtypes"]["q"] == "float32"


@pytest.mark.parametrize("model", ["flux", "cogvideox"])
def test_diffusers_outputs_bit_identical_with_capture(diffusers_run, model):
    plain = np.load(diffusers_run["folder"] / "plain" / f"{model}.npy")
    captured = np.load(diffusers_run["folder"] / "captured" / f"{model}.npy")
    assert plain.shape == captured.shape and bits(plain) == bits(captured)


def test_diffusers_replay_through_the_models_backend_is_bit_identical(diffusers_run, tmp_path):
    # Every Flux and CogVideoX call, replayed through the backend the model ran (CPU flash, float32)
    # from the captured tensors, must give the model's own output exactly.
    assert {c["backend"] for c in diffusers_run["calls"]} == {CPU_FLASH}
    assert_replay_reproduces_captured_out(the_capture(diffusers_run["folder"] / "caps"), tmp_path)


# ---------------------------------------------------------------------------------------------
# (c) torch.compile (inductor, CPU).


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    folder = tmp_path_factory.mktemp("compile")
    # Fresh inductor caches for each run, so the captured process really traces and compiles.
    plain = run_python_job("compile_job.py", "--save", folder / "plain.npy", preload=False,
                           TORCHINDUCTOR_CACHE_DIR=folder / "cache_plain")
    captured = run_python_job("compile_job.py", "--save", folder / "captured.npy", out=folder / "caps",
                              TORCHINDUCTOR_CACHE_DIR=folder / "cache_captured")
    return dict(folder=folder, plain=plain, captured=captured, calls=read_calls(the_capture(folder / "caps")))


def test_compiled_module_runtime_calls_are_captured_and_tracing_is_not(compiled):
    # 3 runs of the compiled module = 3 real calls. Dynamo/AOT tracing calls SDPA on fake tensors
    # (more calls, no data): any of those recorded would make more than 3, or fail reading.
    calls = compiled["calls"]
    assert len(calls) == 3, attncap_lines(compiled["captured"].stderr)
    counts = summary(compiled["captured"].stderr)
    assert counts and (counts["seen"], counts["captured"], counts["failed"]) == (3, 3, 0), counts
    for c in calls:
        # Inductor's Python wrapper calls the backend op directly (observed: the CPU flash op).
        assert c["op"] == CPU_FLASH and c["backend"] == CPU_FLASH, c["op"]
        assert c["q"].shape == (2, 4, 10, 16) and c["is_causal"] is True
        # The call site is inductor's generated wrapper, in the run's cache folder.
        assert str(compiled["folder"] / "cache_captured") in c["metadata"].get("call_site", ""), c["metadata"]


def test_compiled_calls_hold_real_runtime_data(compiled):
    # The recorded out is what the op computes on the recorded inputs: real tensors, not fakes.
    import torch

    for c in read_calls(the_capture(compiled["folder"] / "caps"), as_torch=True):
        assert c["q"].abs().sum() > 0
        again = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(c["q"], c["k"], c["v"], is_causal=True)[0]
        assert torch.equal(again, c["out"]), c["call_index"]


def test_compiled_calls_replay_to_the_captured_out(compiled, tmp_path):
    assert_replay_reproduces_captured_out(the_capture(compiled["folder"] / "caps"), tmp_path)


def test_compiled_outputs_bit_identical_with_capture(compiled):
    plain, captured = np.load(compiled["folder"] / "plain.npy"), np.load(compiled["folder"] / "captured.npy")
    assert bits(plain) == bits(captured)


# ---------------------------------------------------------------------------------------------
# (d) inference_mode, GQA, causal, float additive mask, dropout in training mode.

VARIANTS = ["inference_mode", "gqa", "causal", "float_mask", "dropout"]  # the job's call order


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    folder = tmp_path_factory.mktemp("variants")
    run_python_job("sdpa_variants_job.py", "--save", folder / "plain.npz", preload=False)
    captured = run_python_job("sdpa_variants_job.py", "--save", folder / "captured.npz", out=folder / "caps")
    calls = read_calls(the_capture(folder / "caps"))
    return dict(folder=folder, captured=captured, list=calls, calls=dict(zip(VARIANTS, calls)))


def test_variants_each_call_captured_once(variants):
    assert len(variants["list"]) == len(VARIANTS), attncap_lines(variants["captured"].stderr)
    assert {c["op"] for c in variants["list"]} == {SDPA}


def test_variant_outputs_bit_identical_with_capture(variants):
    # Dropout included: capture must not consume the job's random numbers.
    plain, captured = np.load(variants["folder"] / "plain.npz"), np.load(variants["folder"] / "captured.npz")
    for name in VARIANTS:
        assert bits(plain[name]) == bits(captured[name]), name


def test_variant_captured_out_is_the_models_output(variants):
    plain = np.load(variants["folder"] / "plain.npz")
    for name, c in variants["calls"].items():
        assert bits(c["out"]) == bits(plain[name]), name


def test_variant_calls_replay_to_the_captured_out(variants, tmp_path):
    # Dropout is left out: replay runs without it (and says so).
    keep = {c["call_index"] for name, c in variants["calls"].items() if name != "dropout"}
    assert_replay_reproduces_captured_out(the_capture(variants["folder"] / "caps"), tmp_path, keep)


def test_inference_mode_call_is_captured(variants):
    # Inference tensors cannot be used by autograd; capture must still read and copy them.
    c = variants["calls"]["inference_mode"]
    assert c["q"].shape == (1, 2, 8, 16) and c["op"] == SDPA


def test_gqa_keeps_kv_heads_unexpanded_and_records_enable_gqa(variants):
    c = variants["calls"]["gqa"]
    assert c["q"].shape == (1, 8, 6, 16)
    assert c["k"].shape == c["v"].shape == (1, 2, 6, 16)  # not repeated to 8 heads
    assert c["enable_gqa"] is True and c["out"].shape == (1, 8, 6, 16)


def test_causal_is_recorded_with_sdpa_alignment(variants):
    c = variants["calls"]["causal"]
    assert c["is_causal"] is True and c["causal_alignment"] == "top_left"
    assert c["q"].shape == (1, 2, 7, 16) and c["k"].shape == (1, 2, 9, 16)
    assert variants["calls"]["gqa"]["is_causal"] is False


def test_float_additive_mask_is_recorded_with_its_values(variants):
    c = variants["calls"]["float_mask"]
    assert c["dtypes"]["mask"] == "float32" and c["mask"].shape == (2, 1, 5, 6)
    assert np.isneginf(c["mask"][..., 4:]).all() and np.isfinite(c["mask"][..., :4]).all()


def test_dropout_in_training_mode_is_recorded(variants):
    c = variants["calls"]["dropout"]
    assert c["dropout_p"] == 0.25
    assert all(variants["calls"][n]["dropout_p"] == 0.0 for n in VARIANTS if n != "dropout")


# ---------------------------------------------------------------------------------------------
# (e) a training step: backward attention ops only with ATTNCAP_BACKWARD=1.


@pytest.fixture(scope="module")
def training(tmp_path_factory):
    folder = tmp_path_factory.mktemp("train")
    run_python_job("train_job.py", "--save", folder / "plain.npy", preload=False)
    default = run_python_job("train_job.py", "--save", folder / "default.npy", out=folder / "caps_default")
    backward = run_python_job("train_job.py", "--save", folder / "backward.npy", out=folder / "caps_backward",
                              ATTNCAP_BACKWARD="1")
    return dict(folder=folder, default=default, backward=backward)


def test_training_results_bit_identical_with_capture(training):
    plain = np.load(training["folder"] / "plain.npy")
    for name in ("default", "backward"):
        assert bits(plain) == bits(np.load(training["folder"] / f"{name}.npy")), name


def test_no_backward_op_captured_by_default(training):
    calls = read_calls(the_capture(training["folder"] / "caps_default"))
    assert [(c["op"], c["backend"]) for c in calls] == [(SDPA, CPU_FLASH)]  # the forward call only
    counts = summary(training["default"].stderr)
    assert counts and (counts["seen"], counts["failed"]) == (1, 0), counts  # backward not even matched


def test_backward_ops_captured_with_attncap_backward(training):
    calls = read_calls(the_capture(training["folder"] / "caps_backward"))
    ops = [c["op"] for c in calls]
    stderr = "\n".join(attncap_lines(training["backward"].stderr))
    assert ops[0] == SDPA, ops
    backward = [c for c in calls if "backward" in c["op"]]
    # autograd calls aten::_scaled_dot_product_flash_attention_for_cpu_backward: it must be recorded,
    # with the forward's Q, K, V, and no call may fail to be captured.
    assert [c["op"] for c in backward] == [CPU_FLASH + "_backward"], f"ops {ops}\n{stderr}"
    assert backward[0]["q"].shape == (2, 2, 8, 16) and backward[0]["is_causal"] is True
    assert "a call was not captured" not in stderr, stderr
    assert summary(training["backward"].stderr)["failed"] == 0, stderr


# ---------------------------------------------------------------------------------------------
# (f) nn.MultiheadAttention in eval mode, need_weights=False.
#
# With torch 2.11 on the CPU, the fast path (aten::_native_multi_head_attention) does not call SDPA:
# its CPU kernel computes attention with bmm + _softmax + bmm inside the one op, so there is nothing
# to capture; docs/capture.md says so, and capture says so at run time. The slow path (grad
# enabled) goes through F.scaled_dot_product_attention and is captured.


@pytest.fixture(scope="module")
def mha(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mha")
    run_python_job("mha_job.py", "--save", folder / "plain.npz", preload=False)
    captured = run_python_job("mha_job.py", "--save", folder / "captured.npz", out=folder / "caps")
    return dict(folder=folder, captured=captured, calls=read_calls(the_capture(folder / "caps")))


def test_mha_outputs_bit_identical_with_capture(mha):
    plain, captured = np.load(mha["folder"] / "plain.npz"), np.load(mha["folder"] / "captured.npz")
    for name in ("fast", "slow"):
        assert bits(plain[name]) == bits(captured[name]), name


def test_mha_slow_path_sdpa_is_captured(mha):
    slow = [c for c in mha["calls"] if c["q"].shape[2] == 6]  # the slow path's 6 tokens
    assert len(slow) == 1, [c["q"].shape for c in mha["calls"]]
    assert slow[0]["op"] == SDPA and slow[0]["q"].shape == (2, 4, 6, 8)  # per-head Q: 4 heads of 8


def test_mha_fast_path_is_reported_as_not_captured(mha):
    # Nothing of the fast path's 10 tokens is in the capture, and the job's stderr says why, once.
    assert not [c for c in mha["calls"] if c["q"].shape[2] == 10]
    notices = [line for line in attncap_lines(mha["captured"].stderr) if "MultiheadAttention" in line]
    assert len(notices) == 1 and "not in the capture" in notices[0], mha["captured"].stderr


# ---------------------------------------------------------------------------------------------
# (g) An attention op registered after torch is imported (as flash-attn, SageAttention and xformers
# register theirs): no hook can be put on it at start, so RecordFunction observes it.


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    folder = tmp_path_factory.mktemp("registered")
    run_python_job("registered_op_job.py", "--save", folder / "plain.npz", preload=False)
    captured = run_python_job("registered_op_job.py", "--save", folder / "captured.npz", out=folder / "caps")
    return dict(folder=folder, captured=captured, calls=read_calls(the_capture(folder / "caps")))


def test_registered_op_calls_are_captured_with_their_arguments(registered):
    calls = registered["calls"]
    assert [c["op"] for c in calls] == ["flash_attn_mock::fwd"] * 3, attncap_lines(registered["captured"].stderr)
    # Its SDPA inside (hooked) is not a call of its own; it names the backend.
    assert {c["backend"] for c in calls} == {SDPA}
    assert [c["is_causal"] for c in calls] == [False, True, False]
    assert [c["scale"] for c in calls] == pytest.approx([0.25, 0.25, 0.1])
    assert {c["layout"] for c in calls} == {"bshd"} and {c["causal_alignment"] for c in calls} == {"bottom_right"}
    assert all(c["q"].shape == (2, 9, 3, 16) for c in calls)


def test_registered_op_outputs_bit_identical_and_recorded(registered):
    plain, captured = np.load(registered["folder"] / "plain.npz"), np.load(registered["folder"] / "captured.npz")
    for name, call in zip(("plain", "causal", "scaled"), registered["calls"]):
        assert bits(plain[name]) == bits(captured[name]), name
        assert bits(call["out"]) == bits(plain[name]), name


def test_registered_op_says_once_that_it_needs_record_function(registered):
    notices = [line for line in attncap_lines(registered["captured"].stderr) if "RecordFunction" in line]
    assert len(notices) == 1 and "flash_attn_mock::fwd" in notices[0], registered["captured"].stderr


def test_no_record_function_when_every_matched_op_is_hooked(minilm):
    # torch's own attention ops are all hooked at start: nothing falls back to RecordFunction,
    # whose per-op cost every op of the job would pay.
    assert not [line for line in attncap_lines(minilm["captured"].stderr) if "RecordFunction" in line]
