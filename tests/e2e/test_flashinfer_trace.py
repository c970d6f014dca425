"""FlashInfer-Trace out and in, and FlashInfer-Bench traces (formats/flashinfer_trace.h,
replay/report/flashinfer_traces.h; issue 59). A transformers decoder (GQA, a left-padded batch,
generate()) captured under the preload is converted: FlashInfer-Bench's own schema models read the
folder, its definitions' reference code gives what attnreplay's reference gives, the tensors are the
capture's rows that see a key bit for bit, and the folder replays with the capture's error
statistics. Paged and MLA-shaped calls map onto the paged definitions; calls no definition holds
are listed with the reason; fi_trace dumps replay as generated calls; --fib-traces validates."""
import importlib.util
import json
import sys
import types

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import attnreplay_h5
from capture_common import read_calls, run_python_job, the_capture
from conftest import FAST, load_json, load_pt, run_attnreplay


def fib_data():
    """flashinfer_bench.data and .bench.utils, without the package's __init__ (which imports its GPU
    dependencies: the test venv installs it without them)."""
    if "flashinfer_bench.data" not in sys.modules:
        spec = importlib.util.find_spec("flashinfer_bench")
        package = types.ModuleType("flashinfer_bench")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["flashinfer_bench"] = package
    import flashinfer_bench.bench.utils as utils
    import flashinfer_bench.data as data
    return data, utils


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fib_decoder")
    run_python_job("decoder_job.py", out=folder / "caps")
    capture = the_capture(folder / "caps")
    result = run_attnreplay("convert", capture, folder / "fi", "--to", "flashinfer-trace", check=0)
    return folder, capture, folder / "fi", result


def kept_rows(call):
    """Per batch element: the query rows that see a key and the key range they see, from the
    capture's own mask and causality (numpy, apart from the C++ mapping)."""
    q = call["q"]
    b, h, sq, d = q.shape
    skv = call["k"].shape[2]
    allowed = np.broadcast_to(call["mask"].astype(bool) if call["mask"] is not None else True, (b, 1, sq, skv))[:, 0]
    if call["is_causal"]:
        allowed = allowed & np.tril(np.ones((sq, skv), dtype=bool))
    for batch in range(b):
        rows = [i for i in range(sq) if allowed[batch, i].any()]
        keys = np.flatnonzero(allowed[batch].any(axis=0))
        yield batch, rows, keys.min(), keys.max() + 1


def test_every_call_of_the_decoder_is_written(decoder):
    _, _, _, result = decoder
    assert result.returncode == 0, result.stderr
    assert "10 of 10 calls written" in result.stdout


def test_flashinfer_bench_reads_the_folder_with_its_own_models(decoder):
    _, _, fi, _ = decoder
    data, _ = fib_data()
    traces = data.TraceSet.from_path(str(fi))
    # The prefills (causal, the pads left out) and the decode steps (transformers folds a decode's
    # GQA group into the query rows: 2 rows over 2 key heads, every key seen).
    assert sorted(traces.definitions) == ["gqa_ragged_prefill_causal_h4_kv4_d16_fp32", "gqa_ragged_prefill_h2_kv2_d16_fp32"]
    assert {name: len(w) for name, w in traces.workloads.items()} == {
        "gqa_ragged_prefill_causal_h4_kv4_d16_fp32": 4, "gqa_ragged_prefill_h2_kv2_d16_fp32": 6}
    for name, definition in traces.definitions.items():
        assert definition.op_type == "gqa_ragged"
        assert list(definition.inputs) == ["q", "k", "v", "qo_indptr", "kv_indptr", "sm_scale"]
        assert list(definition.outputs) == ["output", "lse"]
        for trace in traces.workloads[name]:
            assert trace.is_workload_trace()
            # The axes bind to the tensors' shapes as FlashInfer-Bench binds them.
            tensors = load_file(str(fi / trace.workload.inputs["q"].path))
            shapes = [tuple(tensors[key].shape) if key in tensors else None for key in definition.inputs]
            assert definition.get_axes_values(shapes) == trace.workload.axes


def test_the_workloads_hold_the_captures_rows_that_see_a_key_bit_for_bit(decoder):
    _, capture, fi, _ = decoder
    data, _ = fib_data()
    traces = data.TraceSet.from_path(str(fi))
    workloads = {}
    for name, lines in traces.workloads.items():
        for trace in lines:
            tensors = load_file(str(fi / trace.workload.inputs["q"].path))
            workloads[(tensors["q"].shape[0], tensors["q"].numpy().tobytes())] = tensors
    for call in read_calls(capture):
        q, k, v, out = call["q"], call["k"], call["v"], call["out"]
        packed = {"q": [], "k": [], "v": [], "output": [], "qo_indptr": [0], "kv_indptr": [0]}
        for batch, rows, first, end in kept_rows(call):
            packed["q"].append(q[batch][:, rows].transpose(1, 0, 2))
            packed["output"].append(out[batch][:, rows].transpose(1, 0, 2))
            packed["k"].append(k[batch][:, first:end].transpose(1, 0, 2))
            packed["v"].append(v[batch][:, first:end].transpose(1, 0, 2))
            packed["qo_indptr"].append(packed["qo_indptr"][-1] + len(rows))
            packed["kv_indptr"].append(packed["kv_indptr"][-1] + end - first)
        want = {name: np.array(parts, dtype=np.int32) if name.endswith("indptr") else np.concatenate(parts)
                for name, parts in packed.items()}
        got = workloads[(want["q"].shape[0], np.ascontiguousarray(want["q"]).tobytes())]
        for name, value in want.items():
            assert np.array_equal(got[name].numpy(), value), (call["call_index"], name)


def test_attnreplay_reads_the_workloads_back_bit_for_bit(decoder):
    folder, _, fi, _ = decoder
    data, _ = fib_data()
    traces = data.TraceSet.from_path(str(fi))
    back = folder / "back.h5"
    run_attnreplay("run", fi, "--kernels", "reference", "--save-inputs", back, "-q", *FAST, check=0)
    calls = read_calls(back)
    lines = [trace for name in sorted(traces.workloads) for trace in traces.workloads[name]]
    assert len(calls) == len(lines) == 10
    for call, trace in zip(calls, lines):
        tensors = load_file(str(fi / trace.workload.inputs["q"].path))
        assert call["layout"] == "thd" and call["metadata"]["flashinfer.definition"] == trace.definition
        for field, key in (("q", "q"), ("k", "k"), ("v", "v"), ("out", "output"), ("cu_seqlens_q", "qo_indptr"),
                           ("cu_seqlens_k", "kv_indptr")):
            assert np.array_equal(call[field], tensors[key].numpy()), (trace.workload.uuid, field)
        assert call["scale"] == trace.workload.inputs["sm_scale"].value


def test_the_definitions_reference_code_computes_what_attnreplays_reference_does(decoder):
    folder, _, fi, _ = decoder
    data, utils = fib_data()
    traces = data.TraceSet.from_path(str(fi))
    outs, record = folder / "fi_outs", folder / "fi_reference.json"
    run_attnreplay("run", fi, "--kernels", "reference", "--save-outputs", outs, "--json", record, "-q", *FAST, check=0)
    for index, call in enumerate(load_json(record)["calls"]):
        definition = traces.definitions[call["metadata"]["flashinfer.definition"]]
        workload = data.Workload.model_validate_json(call["metadata"]["flashinfer.workload"])
        inputs = utils.gen_inputs(definition, workload, "cpu", utils.load_safetensors(definition, workload, fi))
        namespace = {}
        exec(definition.reference, namespace)
        output, lse = namespace["run"](*inputs)
        ours = load_pt(outs / f"call{index}_reference.pt")["out"]  # (1, heads, total_q, dim)
        theirs = output.double().permute(1, 0, 2).unsqueeze(0)
        assert torch.allclose(theirs, ours.double(), rtol=0, atol=1e-6), index
        # The log-sum-exp in base 2, as FlashInfer returns it.
        assert lse.shape == output.shape[:2] and torch.isfinite(lse).all()


def test_the_folder_replays_with_the_captures_error_statistics(decoder):
    folder, capture, fi, _ = decoder
    before, after = folder / "before.json", folder / "after.json"
    run_attnreplay("run", capture, "--kernels", "reference", "--json", before, "-q", *FAST, check=0)
    run_attnreplay("run", fi, "--kernels", "reference", "--json", after, "-q", *FAST, check=0)
    original, converted = load_json(before)["calls"], load_json(after)["calls"]
    assert len(converted) == len(original) == 10
    # The folder's order is its definitions', the capture's call order within each: match by metadata.
    by_origin = {int(c["metadata"]["capture.call_index"]): c for c in converted}
    for call in original:
        replayed = by_origin[call["call_index"]]
        assert replayed["metadata"]["layer"] == call["metadata"]["layer"]
        model = {k["kernel"]: k for k in call["kernels"]}["model-output"]["error"]
        again = {k["kernel"]: k for k in replayed["kernels"]}["model-output"]["error"]
        # The pads see no key: the capture's figures over the rows that do are the folder's figures.
        want = model
        assert "no_key_rows" not in again
        for field in ("max_abs", "mean_abs", "rel_l2", "cosine"):
            assert again[field] == pytest.approx(want[field], rel=1e-9, abs=1e-15), (call["call_index"], field)


def test_fib_traces_validate_and_map_the_statuses(decoder):
    folder, _, fi, _ = decoder
    data, _ = fib_data()
    path = folder / "traces.jsonl"
    result = run_attnreplay("run", fi, "--kernels", "reference,torch-math,sage1-int8-cpu", "--baseline", "torch-math",
                            "--fib-traces", path, "-q", *FAST, check=0)
    assert "20 FlashInfer-Bench traces" in result.stdout  # sage1-int8-cpu declines fp32: no trace for it
    assert "sage1-int8-cpu declined 10 workloads: no trace" in result.stdout
    traces = [data.Trace.model_validate_json(line) for line in path.read_text().splitlines()]
    assert len(traces) == 20
    for trace in traces:
        assert trace.solution in ("reference", "torch-math")
        assert trace.evaluation.status == data.EvaluationStatus.PASSED
        performance = trace.evaluation.performance
        assert performance.latency_ms > 0 and performance.reference_latency_ms > 0
        if trace.solution == "torch-math":
            assert performance.speedup_factor == pytest.approx(1.0)
        assert trace.evaluation.correctness.max_relative_error < 1e-2
    # A quantized kernel beyond FlashInfer-Bench's tolerance is INCORRECT_NUMERICAL, without performance.
    ragged = folder / "bf16.h5"
    run_attnreplay("run", "--routine", "BatchPrefillWithRaggedKVCacheWrapper", "--batch_size", "2", "--num_qo_heads", "2",
                   "--s_qo", "64", "--head_dim_qk", "64", "--causal", "--kernels", "reference", "--save-inputs", ragged,
                   "-q", *FAST, check=0)
    run_attnreplay("convert", ragged, folder / "fi_bf16", "--to", "flashinfer-trace", check=0)
    run_attnreplay("run", folder / "fi_bf16", "--kernels", "sage1-int8-cpu", "--fib-traces", path, "-q", *FAST, check=0)
    (trace,) = [data.Trace.model_validate_json(line) for line in path.read_text().splitlines()]
    assert trace.definition == "gqa_ragged_prefill_causal_h2_kv2_d64"
    assert trace.evaluation.status == data.EvaluationStatus.INCORRECT_NUMERICAL
    assert trace.evaluation.performance is None and trace.evaluation.correctness.extra["beyond_tolerance"] > 0


def test_fib_traces_of_other_captures_say_why_there_are_none(decoder):
    folder, capture, _, _ = decoder
    result = run_attnreplay("run", capture, "--calls", "0", "--kernels", "reference", "--fib-traces", folder / "none.jsonl",
                            "-q", *FAST, check=0)
    assert "0 FlashInfer-Bench traces" in result.stdout
    assert "1 call not read from a FlashInfer-Trace folder" in result.stdout


def test_paged_decode_and_mla_calls_map_onto_the_paged_definitions(tmp_path):
    g = torch.Generator().manual_seed(1)
    # A vLLM-style paged decode: 3 sequences, pages of 4 tokens dealt out of order, GQA 4/2.
    k_pages, v_pages = (torch.randn(6, 4, 2, 32, generator=g).to(torch.bfloat16) for _ in range(2))
    decode = {"op": "vllm::paged_decode", "layout": "thd", "q": torch.randn(3, 4, 32, generator=g).to(torch.bfloat16),
              "k": k_pages, "v": v_pages, "is_causal": True, "causal_alignment": "bottom_right",
              "cu_seqlens_q": torch.tensor([0, 1, 2, 3], dtype=torch.int32),
              "block_table": torch.tensor([[5, 0], [2, 3], [1, 4]], dtype=torch.int32),
              "seqused_k": torch.tensor([7, 3, 8], dtype=torch.int32)}
    # MLA with its matrices absorbed, as capture records FlashInfer's MLA wrapper: one key head
    # [ckv, kpe] and one value head ckv.
    ckv, kpe = torch.randn(5, 1, 1, 16, generator=g), torch.randn(5, 1, 1, 8, generator=g)
    mla = {"op": "flashinfer::BatchMLAPagedAttentionWrapper.run", "layout": "thd",
           "q": torch.randn(2, 4, 24, generator=g), "k": torch.cat([ckv, kpe], dim=-1), "v": ckv.clone(),
           "cu_seqlens_q": torch.tensor([0, 1, 2], dtype=torch.int32),
           "block_table": torch.tensor([[0, 1, 2], [3, 4, 0]], dtype=torch.int32),
           "seqused_k": torch.tensor([3, 2], dtype=torch.int32)}
    # What no definition holds: a sliding window; a bias.
    q = torch.randn(1, 2, 8, 16, generator=g)
    window = {"q": q, "k": q.clone(), "v": q.clone(), "is_causal": True, "window_left": 2}
    bias = {"q": q, "k": q.clone(), "v": q.clone(), "mask": torch.randn(1, 1, 8, 8, generator=g)}
    attnreplay_h5.write_calls(str(tmp_path / "cap.h5"), [decode, mla, window, bias])
    result = run_attnreplay("convert", tmp_path / "cap.h5", tmp_path / "fi", "--to", "flashinfer-trace", check=0)
    assert result.returncode == 0, result.stderr
    assert "2 of 4 calls written" in result.stdout
    assert "not written, 1 call (2): a sliding window (left 2)" in result.stdout
    assert "not written, 1 call (3): its mask is dense: query row 0 of batch 0 adds " in result.stdout
    assert "(a bias, not only 0 and values that hide a key)" in result.stdout
    data, _ = fib_data()
    traces = data.TraceSet.from_path(str(tmp_path / "fi"))
    assert sorted(traces.definitions) == ["gqa_paged_decode_h4_kv2_d32_ps1", "mla_paged_decode_h4_ckv16_kpe8_ps1_fp32"]
    assert list(traces.definitions["mla_paged_decode_h4_ckv16_kpe8_ps1_fp32"].inputs) == [
        "q_nope", "q_pe", "ckv_cache", "kpe_cache", "kv_indptr", "kv_indices", "sm_scale"]
    # Both replay with the original's figures (the reference against the stored output is exact
    # where the stored output is the reference's; here: the same kernel's figures on both).
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    run_attnreplay("run", tmp_path / "cap.h5", "--calls", "0-1", "--kernels", "reference,torch-math", "--json", before,
                   "-q", *FAST, check=0)
    run_attnreplay("run", tmp_path / "fi", "--kernels", "reference,torch-math", "--json", after, "-q", *FAST, check=0)
    original = {c["op"]: c for c in load_json(before)["calls"]}
    for call in load_json(after)["calls"]:
        origin = original[call["metadata"]["capture.op"]]
        assert call["shape"]["seq_q"] == origin["shape"]["seq_q"]
        errors = {k["kernel"]: k["error"]["rel_l2"] for k in call["kernels"]}
        want = {k["kernel"]: k["error"]["rel_l2"] for k in origin["kernels"]}
        assert errors["reference"] == 0
        assert errors["torch-math"] == pytest.approx(want["torch-math"], rel=1e-6)
    # FlashInfer-Bench's loader takes the tensors the definitions describe.
    for name, definition in traces.definitions.items():
        workload = traces.workloads[name][0].workload
        _, utils = fib_data()
        inputs = utils.gen_inputs(definition, workload, "cpu", utils.load_safetensors(definition, workload, tmp_path / "fi"))
        namespace = {}
        exec(definition.reference, namespace)
        output, lse = namespace["run"](*inputs)
        assert torch.isfinite(output.float()).all() and torch.isfinite(lse).all()


def test_converting_again_adds_nothing_and_damaged_workloads_are_named(decoder, tmp_path):
    _, capture, fi, _ = decoder
    copy = tmp_path / "fi"
    run_attnreplay("convert", capture, copy, "--to", "flashinfer-trace", check=0)
    run_attnreplay("convert", capture, copy, "--to", "flashinfer-trace", check=0)
    lines = sum(len(p.read_text().splitlines()) for p in copy.glob("workloads/*/*.jsonl"))
    assert lines == 10
    workloads = sorted(copy.glob("workloads/*/*.jsonl"))[0]
    first, *rest = workloads.read_text().splitlines()
    trace = json.loads(first)
    trace["workload"]["axes"]["total_q"] += 1
    workloads.write_text("\n".join([json.dumps(trace), *rest]) + "\n")
    result = run_attnreplay("run", copy, "--kernels", "reference", "-q", *FAST)
    assert result.returncode == 1
    assert f"{workloads}: line 1 (workload {trace['workload']['uuid']}): input 'q'" in result.stderr
    assert "the definition and axes say" in result.stderr


def test_fi_trace_dumps_replay_as_generated_calls(tmp_path):
    # As FlashInfer writes them: constant axes with values, variable ones without, no workload;
    # the name says nothing of causality.
    decode = {"name": "gqa_paged_decode_h8_kv2_d64_ps16", "op_type": "gqa_paged", "tags": ["fi_api:flashinfer.decode"],
              "axes": {"batch_size": {"type": "var"}, "num_qo_heads": {"type": "const", "value": 8},
                       "num_kv_heads": {"type": "const", "value": 2}, "head_dim": {"type": "const", "value": 64},
                       "num_pages": {"type": "var"}, "page_size": {"type": "const", "value": 16}},
              "inputs": {"q": {"shape": ["batch_size", "num_qo_heads", "head_dim"], "dtype": "bfloat16"}},
              "outputs": {}}
    prefill = {"name": "gqa_ragged_prefill_h4_kv4_d32", "op_type": "gqa_ragged", "tags": ["fi_api:flashinfer.prefill"],
               "axes": {"total_q": {"type": "var"}, "num_qo_heads": {"type": "const", "value": 4},
                        "num_kv_heads": {"type": "const", "value": 4}, "head_dim": {"type": "const", "value": 32}},
               "inputs": {"q": {"shape": ["total_q", "num_qo_heads", "head_dim"], "dtype": "float16"}},
               "outputs": {}}
    (tmp_path / "dumps").mkdir()
    (tmp_path / "dumps" / "decode.json").write_text(json.dumps(decode))
    (tmp_path / "dumps" / "prefill.json").write_text(json.dumps(prefill))
    record = tmp_path / "r.json"
    run_attnreplay("run", tmp_path / "dumps", "--batch_size", "3", "--s_qo", "16", "--s_kv", "100", "--causal",
                   "--kernels", "reference", "--json", record, "-q", *FAST, check=0)
    first, second = load_json(record)["calls"]
    assert first["shape"]["heads_q"] == 8 and first["shape"]["heads_kv"] == 2 and first["shape"]["head_dim_qk"] == 64
    assert first["dtype"] == "bfloat16" and first["metadata"]["flashinfer.definition"] == decode["name"]
    assert first["sequences"] == {"q_lens": [1, 1, 1], "k_lens": [100, 100, 100]}
    assert "page size 16" in first["batching"]
    assert second["dtype"] == "float16" and second["is_causal"] and second["causal_alignment"] == "bottom_right"
    assert second["sequences"] == {"q_lens": [16, 16, 16], "k_lens": [100, 100, 100]}
