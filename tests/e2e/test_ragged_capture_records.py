"""Capture of ragged and paged calls gives the records it gave when they were mapped on the job's
thread (tests/e2e/golden/ragged_records/, written by the capture of 2026-11-29 before that mapping
moved to capture's own thread): every stand-in of a serving library's ops (flash-attn's varlen and
FlashAttention-3's forward, vLLM's and SGLang's builds, FlashInfer's wrappers and
flash_attn_with_kvcache through their Python entry points), every tensor bit for bit, with its
dtype and strides, and every field and argument, but those that name the process and the moment.

ATTNREPLAY_WRITE_GOLDEN=1 writes the files anew from this build's capture (the old ones are what a
change to capture is checked against: rewrite them only for a change meant to alter records)."""
import json
import os
from pathlib import Path

import numpy as np
import pytest

from capture_common import read_calls, run_python_job, the_capture

GOLDEN = Path(__file__).resolve().parent / "golden" / "ragged_records"
JOBS = ["flash_attn_varlen_job.py", "vllm_flash_attn_job.py", "sglang_fa3_job.py", "python_entry_points_job.py"]
# What names the process and the moment, and where the job's files sit, not the call.
VOLATILE_METADATA = {"pid", "thread", "time_unix_s", "duration_s", "sequence_nr", "call_site"}
TENSORS = ["q", "k", "v", "mask", "out", "alibi_slopes", "sinks", "cu_seqlens_q", "cu_seqlens_k", "seqused_k",
           "block_table"]


def record_of(call):
    """(arrays, fields) of one call as the golden file holds it: each tensor's stored bits, and
    everything else as JSON."""
    arrays = {name: call["bits"][name] for name in TENSORS if call.get(name) is not None}
    fields = {key: value for key, value in call.items()
              if key not in TENSORS and key not in ("bits", "metadata", "devices")}
    fields["metadata"] = {k: v for k, v in call["metadata"].items() if k not in VOLATILE_METADATA}
    fields["dtypes"] = {k: v for k, v in call["dtypes"].items() if k in arrays}
    fields["strides"] = {k: list(v) for k, v in call["strides"].items() if k in arrays}
    return arrays, json.loads(json.dumps(fields, default=str))


@pytest.mark.parametrize("job", JOBS)
def test_records_are_those_captured_before(job, tmp_path):
    run_python_job(job, "--save", tmp_path / "out.npz", out=tmp_path / "caps")
    calls = [record_of(call) for call in read_calls(the_capture(tmp_path / "caps"))]
    golden = GOLDEN / (Path(job).stem + ".npz")
    if os.environ.get("ATTNREPLAY_WRITE_GOLDEN") == "1":
        GOLDEN.mkdir(parents=True, exist_ok=True)
        arrays = {f"{i}.{name}": array for i, (tensors, _) in enumerate(calls) for name, array in tensors.items()}
        arrays["fields"] = np.array(json.dumps([fields for _, fields in calls], sort_keys=True))
        np.savez_compressed(golden, **arrays)
    saved = np.load(golden)
    want = json.loads(str(saved["fields"]))
    assert len(calls) == len(want), f"{job}: {len(calls)} calls captured, {len(want)} before"
    for i, ((tensors, fields), expected) in enumerate(zip(calls, want)):
        assert fields == expected, f"{job} call {i}"
        stored = sorted(key.split(".", 1)[1] for key in saved.files if key.startswith(f"{i}."))
        assert sorted(tensors) == stored, f"{job} call {i}"
        for name, array in tensors.items():
            before = saved[f"{i}.{name}"]
            assert array.shape == before.shape and array.dtype == before.dtype, f"{job} call {i} {name}"
            assert np.array_equal(array, before), f"{job} call {i} {name}"
