"""The `attnreplay` command line: the run table, --refcheck exit codes, kernel and call selection,
the CSV and its rerun commands, `info`, and the generated-shape flags (GQA, cross-length causal
with bottom-right alignment, head_dim_vo != head_dim_qk)."""

import csv
import importlib.util
import math
import os
import re
import shlex

import numpy as np
import pytest
import torch

import attnreplay_h5
from conftest import FAST, load_json, load_pt, run_attnreplay

CPU_KERNELS = ("reference", "torch-flash-cpu", "torch-math")


def check_other_kernels(statuses, ran="passed"):
    # Kernels for other devices (CUDA) decline on a machine without one, and run where there is.
    for kernel, status in statuses.items():
        if kernel not in CPU_KERNELS:
            assert status in ("not_supported", ran), (kernel, status)

# The reference is in no group ("all"): named, it is timed as a kernel.
ALL = "all,reference"

# replay/report/results_csv.cpp's columns, in order: the CSV's documented fixed header.
CSV_HEADER = [
    "source", "call_index", "case_tag", "op", "backend", "batch", "heads_q", "heads_kv", "seq_q", "seq_kv",
    "head_dim_qk", "head_dim_vo", "dtype", "layout", "is_causal", "causal_alignment", "mask", "mask_structure", "batching", "scale", "flops",
    "bytes", "arithmetic_intensity", "kernel", "status", "reason", "time_method", "cache", "timed", "median_s", "min_s",
    "max_s", "stdev_rel", "spread_rel", "median_ci_low_s", "median_ci_high_s", "median_s_with_preparation",
    "median_s_kernel_alone", "preparation_median_s", "preparation_ratio_to_bound", "samples", "discarded_samples", "sm_clock_mhz", "power_w",
    "tflops", "gbytes_per_s", "matrix_ceiling_fraction",
    "copy_ceiling_fraction", "max_abs", "mean_abs", "mse",
    "rmse", "std_abs", "rel_l1", "rel_l2", "cosine", "nan_count", "inf_count", "rows_compared", "sampled", "rerun",
]

TABLE_COLUMNS = ["kernel", "status", "timed", "median ms", "±%", "TFLOP/s", "GB/s", "%peak", "MHz", "max_abs", "rel_l2",
                 "cosine"]


def cosine_value(text):
    """The table's cosine: "1", "1-2.1e-06" (its distance from 1, where small) or "0.998765"."""
    if text == "1":
        return 1.0
    if text.startswith("1-") or text.startswith("1+"):
        return 1 + float(text[1:])
    return float(text)


def table_rows(stdout):
    """{kernel: [status, timed, median ms, ±%, TFLOP/s, GB/s, %peak, MHz, max_abs, rel_l2, cosine]} of the printed table."""
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["kernel", "status"])
    assert re.sub(r"\s+", " ", lines[header].strip()) == " ".join(TABLE_COLUMNS)
    rows = {}
    for line in lines[header + 1:]:
        fields = line.split()
        if len(fields) != len(TABLE_COLUMNS) or line.startswith("    "):
            break
        rows[fields[0]] = fields[1:]
    return rows


@pytest.fixture(scope="module")
def big_run(tmp_path_factory):
    """The shape the brief names, once: 1 batch, 4 heads, 1000 tokens, head dim 64, bf16."""
    folder = tmp_path_factory.mktemp("big")
    result = run_attnreplay("run", "--shape", "1,4,1000,64", "--kernels", ALL, "--refcheck",
                            "--json", folder / "r.json", "--csv", folder / "r.csv", *FAST)
    return result, load_json(folder / "r.json"), folder


def test_table_shows_every_cpu_kernel_with_speed_and_error(big_run):
    result, report, _ = big_run
    rows = table_rows(result.stdout)
    assert set(CPU_KERNELS) <= set(rows), result.stdout
    for kernel in CPU_KERNELS:
        status, timed, median_ms, spread, tflops, gbps, peak, clock, max_abs, rel_l2, cosine = rows[kernel]
        assert status == "passed", result.stdout
        assert (peak, clock) == ("-", "-")  # GPU figures: no ceiling, no SM clock on the CPU
        for text in (median_ms, spread, tflops, gbps, max_abs, rel_l2):
            assert math.isfinite(float(text)), (kernel, text)
        assert 0.99 < cosine_value(cosine) <= 1, (kernel, cosine)
        assert float(median_ms) > 0 and float(tflops) > 0 and float(gbps) > 0
        # The table's TFLOP/s is the JSON's work over the JSON's median time.
        k = next(k for k in report["calls"][0]["kernels"] if k["kernel"] == kernel)
        # What the time covers: the kernel alone where the whole call (its preparation in) is timed apart.
        assert timed == k["timed"] == ("kernel" if "timing_with_preparation" in k else "call"), (kernel, timed)
        assert float(tflops) == pytest.approx(report["calls"][0]["work"]["flops"] / k["timing"]["median_s"] / 1e12,
                                              rel=1e-3)
    # 2 * b * h * s^2 * (d_qk + d_vo) = 1.024 GFLOP; Q, K, V, O of 256000 bf16 each = 2.05 MB.
    assert "work 1.02 GFLOP, 2.05 MB, 500 FLOP/B" in result.stdout
    check_other_kernels({k: fields[0] for k, fields in rows.items()})
    kernels = report["calls"][0]["kernels"]
    assert f"1 calls, {len(kernels)} results: " in result.stdout and "; 0 input errors" in result.stdout


def test_reference_has_zero_error_against_itself(big_run):
    result, report, _ = big_run
    status, *_, max_abs, rel_l2, cosine = table_rows(result.stdout)["reference"]
    assert (float(max_abs), float(rel_l2), cosine) == (0.0, 0.0, "1")
    error = next(k for k in report["calls"][0]["kernels"] if k["kernel"] == "reference")["error"]
    assert error["max_abs"] == error["mean_abs"] == error["rel_l2"] == error["rel_l1"] == 0
    assert error["cosine"] == pytest.approx(1, abs=1e-15)


def test_refcheck_passes_on_bf16(big_run):
    result, report, _ = big_run
    assert result.returncode == 0, result.stdout + result.stderr
    assert report["calls"][0]["dtype"] == "bfloat16"
    statuses = {k["kernel"]: k["status"] for k in report["calls"][0]["kernels"]}
    assert all(statuses[k] == "passed" for k in CPU_KERNELS), statuses
    check_other_kernels(statuses)


def test_impossible_threshold_exits_3(tmp_path):
    # A cosine above 1 cannot hold: every kernel is 'incorrect', exit 3, JSON still written.
    result = run_attnreplay("run", "--shape", "1,2,64,32", "--kernels", ALL, "--refcheck-min-cosine", "1.1", "--json",
                            tmp_path / "r.json", *FAST)
    assert result.returncode == 3, result.stdout + result.stderr
    kernels = [k for k in load_json(tmp_path / "r.json")["calls"][0]["kernels"] if k["status"] != "not_supported"]
    assert {k["kernel"] for k in kernels} >= set(CPU_KERNELS)
    assert {k["status"] for k in kernels} == {"incorrect"}
    assert all(any(f.startswith("cosine") and "< 1.1" in f for f in k["refcheck_failures"]) for k in kernels)


def test_the_reference_is_computed_for_every_call_and_timed_only_when_named(tmp_path):
    run_attnreplay("run", "--shape", "1,2,64,32", "--json", tmp_path / "r.json", *FAST, check=0)
    call = load_json(tmp_path / "r.json")["calls"][0]
    names = {k["kernel"] for k in call["kernels"]}
    assert "torch-math" in names and not names & {"reference", "reference-cuda"}
    assert call["reference"]["rows"] == 64  # every kernel is still judged against it
    run_attnreplay("run", "--shape", "1,2,64,32", "--kernels", "reference", "--json", tmp_path / "named.json", *FAST,
                   check=0)
    (named,) = load_json(tmp_path / "named.json")["calls"][0]["kernels"]
    assert named["kernel"] == "reference" and named["timing"]["samples"] > 0


def test_a_preloaded_tool_gets_the_ordinary_exit(tmp_path):
    # Where nothing but attnreplay's own code ran, the process ends once its files are written,
    # without libtorch's teardown; a library preloaded into it (a tracer, heaptrack) may still have
    # something to write at exit, so there it ends the ordinary way and the library's destructors run.
    mark = tmp_path / "mark"
    out = tmp_path / "r.json"
    env = {**os.environ, "LD_PRELOAD": os.environ["ATTNREPLAY_EXIT_MARK_LIB"], "ATTNREPLAY_TEST_EXIT_MARK": str(mark)}
    result = run_attnreplay("run", "--shape", "1,2,16,8", "--kernels", "torch-math", "--json", out, *FAST, env=env, check=0)
    assert load_json(out)["calls"][0]["kernels"][0]["status"] == "not_verified"
    assert "1 calls, 1 results" in result.stdout  # the output is flushed either way
    assert mark.read_text() == "destructors ran\n"


def test_an_adapter_whose_library_is_missing_is_reported_not_run(tmp_path):
    """A test list written for a machine with the library: its kernel declines each call with the
    import error, beside the kernels that run, rather than failing the run."""
    if importlib.util.find_spec("flashinfer"):
        pytest.skip("flashinfer is installed here")
    out = tmp_path / "r.json"
    result = run_attnreplay("run", "--shape", "1,2,16,8", "--kernels", "flashinfer-prefill,torch-math", "--json", out,
                            *FAST)
    kernels = {k["kernel"]: k for k in load_json(out)["calls"][0]["kernels"]}
    assert kernels["torch-math"]["status"] == "not_verified"
    assert kernels["flashinfer-prefill"]["status"] == "not_supported"
    assert "flashinfer" in kernels["flashinfer-prefill"]["reason"], kernels["flashinfer-prefill"]
    assert "not run, flashinfer" in result.stdout


def test_unknown_kernel_is_a_clear_error(tmp_path):
    result = run_attnreplay("run", "--shape", "1,2,16,8", "--kernels", "nosuch", "--json", tmp_path / "r.json")
    assert result.returncode != 0
    assert "unknown kernel 'nosuch'" in result.stderr
    for kernel in CPU_KERNELS:  # the message lists what is known
        assert kernel in result.stderr
    assert "kernel " not in result.stdout  # nothing was run


def make_capture(path, count=5):
    rng = np.random.default_rng(7)
    calls = []
    for index in range(count):
        seq = 8 + 4 * index  # distinct shapes tell the calls apart
        calls.append({"call_index": index, "op": f"op{index % 2}",
                      "q": rng.standard_normal((1, 2, seq, 16)).astype(np.float32),
                      "k": rng.standard_normal((1, 2, seq, 16)).astype(np.float32),
                      "v": rng.standard_normal((1, 2, seq, 16)).astype(np.float32)})
    attnreplay_h5.write_calls(str(path), calls)
    return calls


def test_calls_selects_by_index(tmp_path):
    make_capture(tmp_path / "cap.h5")
    run_attnreplay("run", tmp_path / "cap.h5", "--calls", "1-2,4", "--kernels", "reference", "--json",
                   tmp_path / "r.json", "-q", *FAST, check=0)
    calls = load_json(tmp_path / "r.json")["calls"]
    assert [c["call_index"] for c in calls] == [1, 2, 4]
    assert [c["shape"]["seq_q"] for c in calls] == [12, 16, 24]


def run_csv_and_reruns(tmp_path, inputs, kernels=ALL):
    run_attnreplay("run", *inputs, "--kernels", kernels, "--csv", tmp_path / "r.csv", "-q", *FAST, check=0)
    with open(tmp_path / "r.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == CSV_HEADER
    records = [dict(zip(CSV_HEADER, row)) for row in rows[1:]]
    assert all(len(row) == len(CSV_HEADER) for row in rows)
    for number, record in enumerate(records):
        argv = shlex.split(record["rerun"])
        assert argv[:2] == ["attnreplay", "run"], record["rerun"]
        out = tmp_path / f"rerun{number}.csv"
        run_attnreplay(*argv[1:], "--csv", out, "-q", check=0)
        with open(out, newline="") as f:
            again = [dict(zip(CSV_HEADER, row)) for row in list(csv.reader(f))[1:]]
        same = [r for r in again if r["kernel"] == record["kernel"] and r["call_index"] == record["call_index"]]
        assert len(same) == 1, (record["rerun"], again)
        for column in ("source", "op", "batch", "heads_q", "heads_kv", "seq_q", "seq_kv", "head_dim_qk",
                       "head_dim_vo", "dtype", "layout", "is_causal", "mask", "scale", "flops", "bytes", "status",
                       "max_abs", "rel_l2", "cosine"):
            assert same[0][column] == record[column], (column, record["rerun"])
    return records


def test_csv_rerun_commands_reproduce_rows_of_generated_calls(tmp_path):
    records = run_csv_and_reruns(tmp_path, ["--shape", "1,2,32,16", "--num_kv_heads", "1", "--causal"])
    assert {r["kernel"] for r in records} >= set(CPU_KERNELS)  # every kernel's row, run or declined


def test_csv_rerun_commands_reproduce_rows_of_captures(tmp_path):
    make_capture(tmp_path / "cap.h5", count=2)
    records = run_csv_and_reruns(tmp_path, [tmp_path / "cap.h5"], kernels=",".join(CPU_KERNELS))
    assert [(r["call_index"], r["kernel"]) for r in records] == [(str(i), k) for i in range(2) for k in CPU_KERNELS]


def test_csv_rerun_commands_reproduce_sampled_rows(tmp_path):
    # With --ref-sample-rows the rows compared depend on the seed, so the rerun carries it, once: a
    # generated call's own --seed is the sampling seed too (a second --seed is a usage error).
    sampled = ["--ref-sample-rows", "4"]
    records = run_csv_and_reruns(tmp_path, ["--shape", "1,2,32,16", "--seed", "5", *sampled],
                                 kernels="flash-cpu,sage1-int8-cpu")
    assert all(r["rerun"].count("--seed") == 1 and "--seed 5" in r["rerun"] for r in records)
    make_capture(tmp_path / "cap.h5", count=1)
    records = run_csv_and_reruns(tmp_path, [tmp_path / "cap.h5", "--seed", "7", *sampled],
                                 kernels="flash-cpu,sage1-int8-cpu")
    assert all(r["rerun"].count("--seed") == 1 and "--seed 7" in r["rerun"] for r in records)


def test_csv_rerun_commands_quote_paths_with_spaces(tmp_path):
    # The rerun command is meant for a shell: an input path with a space must survive shlex.
    folder = tmp_path / "my captures"
    folder.mkdir()
    make_capture(folder / "cap.h5", count=1)
    run_csv_and_reruns(tmp_path, [folder / "cap.h5"], kernels="reference")


def test_info_lists_calls_ops_shapes_dtypes_and_bytes(tmp_path):
    rng = np.random.default_rng(3)
    q = torch.from_numpy(rng.standard_normal((1, 4, 8, 16))).to(torch.bfloat16)
    k = torch.from_numpy(rng.standard_normal((1, 2, 12, 16))).to(torch.bfloat16)
    v = torch.from_numpy(rng.standard_normal((1, 2, 12, 8))).to(torch.bfloat16)
    mask = torch.from_numpy(rng.random((1, 1, 8, 12)) > 0.5)
    f32 = rng.standard_normal((2, 5, 3, 4)).astype(np.float32)
    attnreplay_h5.write_calls(str(tmp_path / "cap.h5"), [
        {"call_index": 7, "op": "aten::scaled_dot_product_attention", "backend": "flash", "q": q, "k": k, "v": v,
         "mask": mask, "is_causal": True, "causal_alignment": "bottom_right"},
        {"call_index": 9, "op": "flash_attn_func", "layout": "bshd", "q": f32, "k": f32, "v": f32, "out": f32,
         "metadata": {"layer": "3", "pid": "42", "call_site": "/env/lib/python3.12/site-packages/m/attn.py:7 in f"}},
    ], deduplicate=False)
    result = run_attnreplay("info", tmp_path / "cap.h5", check=0)
    lines = result.stdout.splitlines()
    assert lines[0] == f"{tmp_path / 'cap.h5'}: attnreplay-hdf5 v2, 2 calls"
    at7 = next(i for i, line in enumerate(lines) if line.split()[:1] == ["7"])
    at9 = next(i for i, line in enumerate(lines) if line.split()[:1] == ["9"])
    bytes7 = (q.numel() + k.numel() + v.numel()) * 2 + mask.numel()
    bytes9 = 4 * f32.size * 4
    assert lines[at7].split() == ["7", "aten::scaled_dot_product_attention", "bfloat16", "bhsd", "b1", "hq4", "hkv2",
                                  "sq8", "skv12", "dqk16", "dvo8", "bottom_right", "bool", "1x1x8x12"]
    assert lines[at7 + 1].split() == [f"bytes={bytes7}", "backend=flash"]
    assert lines[at9].split() == ["9", "flash_attn_func", "float32", "bshd", "b2", "hq3", "hkv3", "sq5", "skv5", "dqk4",
                                  "dvo4", "no", "none"]
    # The fields a reader looks for, the call site from its package on; the rest with -v.
    assert lines[at9 + 1].split() == [f"bytes={bytes9}", "layer=3", "call_site=m/attn.py:7", "in", "f", "(+1",
                                      "field:", "-v)"]
    every = run_attnreplay("info", "-v", tmp_path / "cap.h5", check=0).stdout
    assert "pid=42" in every and "call_site=/env/lib/python3.12/site-packages/m/attn.py:7 in f" in every
    assert [line for line in lines if len(line) > 120] == []
    assert "  1 x aten::scaled_dot_product_attention" in lines
    assert "  1 x flash_attn_func" in lines
    assert f"  tensor bytes: {bytes7 + bytes9}" in lines


def numpy_attention(q, k, v, scale, causal_offset=None):
    """fp64 attention of BHSD arrays; causal_offset: row i sees keys j <= i + offset."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.einsum("bhid,bhjd->bhij", q, k) * scale
    if causal_offset is not None:
        i, j = np.indices(scores.shape[-2:])
        scores = np.where(j <= i + causal_offset, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores - np.where(np.isfinite(top), top, 0))
    total = weights.sum(axis=-1, keepdims=True)
    return np.einsum("bhij,bhjd->bhid", np.divide(weights, total, out=np.zeros_like(weights), where=total > 0), v)


GENERATED = {
    # name: (flags, expected shape (b, hq, hkv, sq, skv, dqk, dvo), bottom-right causal)
    "gqa": (["--shape", "2,8,24,16", "--num_kv_heads", "2"], (2, 8, 2, 24, 24, 16, 16), False),
    "bottom_right_short_queries": (["--shape", "1,4,12,16", "--s_kv", "40", "--causal", "--causal_alignment",
                                    "bottom_right"], (1, 4, 4, 12, 40, 16, 16), True),
    "bottom_right_long_queries": (["--shape", "1,2,30,16", "--s_kv", "18", "--num_kv_heads", "1", "--causal",
                                   "--causal_alignment", "bottom_right"], (1, 2, 1, 30, 18, 16, 16), True),
    "head_dim_vo": (["--shape", "1,2,20,32", "--head_dim_vo", "16"], (1, 2, 2, 20, 20, 32, 16), False),
}


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_generated_shapes(tmp_path, name):
    flags, (b, hq, hkv, sq, skv, dqk, dvo), bottom_right = GENERATED[name]
    run_attnreplay("run", *flags, "--dtype", "fp32", "--kernels", ALL, "--refcheck", "--json", tmp_path / "r.json",
                   "--save-inputs", tmp_path / "in.h5", "--save-outputs", tmp_path / "outs", "-q", *FAST, check=0)
    call = load_json(tmp_path / "r.json")["calls"][0]
    assert call["shape"] == {"batch": b, "heads_q": hq, "heads_kv": hkv, "seq_q": sq, "seq_kv": skv,
                             "head_dim_qk": dqk, "head_dim_vo": dvo}
    statuses = {k["kernel"]: k["status"] for k in call["kernels"]}
    if dqk != dvo:
        assert statuses.pop("torch-flash-cpu") == "not_supported"
        reason = next(k["reason"] for k in call["kernels"] if k["kernel"] == "torch-flash-cpu")
        assert f"head_dim_qk {dqk} != head_dim_vo {dvo}" in reason
    # torch agrees with the reference
    assert all(status == "passed" for k, status in statuses.items() if k in CPU_KERNELS), statuses
    check_other_kernels(statuses)
    if bottom_right:
        assert call["is_causal"] and call["causal_alignment"] == "bottom_right"
        pairs = sq * (2 * skv - sq) / 2 if sq <= skv else skv * skv / 2
        assert call["work"]["flops"] == pytest.approx(2 * b * hq * pairs * (dqk + dvo), rel=1e-12)
    # The generated inputs, saved, give numpy's own attention: the reference's masking is right.
    saved = attnreplay_h5.read_calls(str(tmp_path / "in.h5"))[0]
    assert saved["dtypes"]["q"] == "float32" and saved["enable_gqa"] == (hq != hkv)
    expected = numpy_attention(*(saved[n].astype(np.float64) for n in "qkv"), 1 / math.sqrt(dqk),
                               causal_offset=(skv - sq) if bottom_right else None)
    reference = load_pt(tmp_path / "outs" / "call0_reference.pt")["out"].numpy()
    np.testing.assert_allclose(reference, expected, rtol=0, atol=1e-12)


def test_input_preparation_is_timed_beside_the_kernel_when_there_is_any(tmp_path):
    # GQA: the CPU flash backend gets K/V expanded first, which users pay and peers leave out.
    run_attnreplay("run", "--shape", "1,8,64,32", "--num_kv_heads", "2", "--kernels", "torch-flash-cpu,torch-math",
                   "--json", tmp_path / "gqa.json", *FAST, check=0)
    kernels = {k["kernel"]: k for k in load_json(tmp_path / "gqa.json")["calls"][0]["kernels"]}
    prepared = kernels["torch-flash-cpu"]["timing_with_preparation"]
    assert prepared["samples"] > 0 and prepared["median_s"] > 0
    assert "timing_of_preparation" not in kernels["torch-flash-cpu"]  # a third timing, only when asked
    assert "timing_with_preparation" not in kernels["torch-math"]  # math broadcasts kv heads itself
    run_attnreplay("run", "--shape", "1,8,64,32", "--num_kv_heads", "2", "--kernels", "torch-flash-cpu",
                   "--time-preparation", "--json", tmp_path / "alone.json", *FAST, check=0)
    (kernel,) = load_json(tmp_path / "alone.json")["calls"][0]["kernels"]
    alone = kernel["timing_of_preparation"]  # the expansion by itself
    assert alone["samples"] > 0 and 0 < alone["median_s"] < kernel["timing_with_preparation"]["median_s"]
    assert "--time-preparation" in kernel["rerun"]
    # Nothing to prepare: one figure only.
    run_attnreplay("run", "--shape", "1,2,64,32", "--kernels", "torch-flash-cpu", "--json", tmp_path / "plain.json",
                   *FAST, check=0)
    (kernel,) = load_json(tmp_path / "plain.json")["calls"][0]["kernels"]
    assert "timing_with_preparation" not in kernel and "timing_of_preparation" not in kernel


def test_save_inputs_writes_the_replayed_calls_only(tmp_path):
    # --save-inputs writes the calls that were replayed: with --calls, only those.
    import torch

    calls = [{"q": torch.randn(1, 2, 8, 4), "k": torch.randn(1, 2, 8, 4), "v": torch.randn(1, 2, 8, 4),
              "call_index": i} for i in range(3)]
    torch.save({"calls": calls}, tmp_path / "three.pt")
    run_attnreplay("run", tmp_path / "three.pt", "--calls", "1", "--kernels", "reference",
                   "--save-inputs", tmp_path / "picked.h5", *FAST, check=0)
    info = run_attnreplay("info", tmp_path / "picked.h5", check=0)
    assert "1 calls" in info.stdout, info.stdout


def summary_lines(stdout):
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("summary over"))
    return lines[start:]


def test_the_run_ends_with_a_summary_over_its_calls(tmp_path):
    (tmp_path / "two.txt").write_text("--shape 1,2,64,32\n--shape 1,2,96,32\n")
    result = run_attnreplay("run", "--testlist", tmp_path / "two.txt", "--kernels", "all", *FAST, check=0)
    lines = summary_lines(result.stdout)
    # The baseline is whichever exact kernel was fastest here (torch-flash-cpu or torch-math on so
    # small a call, as the machine's load goes).
    base = re.match(r"summary over 2 calls; vs base: time over (\S+)'s \(the fastest exact kernel\)", lines[0])
    assert base and base.group(1) in ("torch-flash-cpu", "torch-math"), lines[0]
    assert lines[2].split()[:5] == ["kernel", "ran", "refused", "failed", "vs"]
    rows = []
    for line in lines[3:]:
        fields = line.replace(" (emul.)", "").split()
        if len(fields) < 5 or not fields[1].isdigit():
            break
        rows.append(fields)
    names = [row[0] for row in rows]
    assert base.group(1) in names and {"torch-flash-cpu", "torch-math", "sage2-int8-fp8-cpu"} <= set(names)
    assert all(row[1] == "2" for row in rows)  # each ran both calls
    # Fastest first; an emulation may beat the exact kernels on calls this small, under load.
    ratios = [float(row[4].rstrip("x")) for row in rows]
    assert ratios == sorted(ratios) and ratios[names.index(base.group(1))] == 1
    assert any(line.startswith("  sage2-int8-fp8-cpu (emul.)") for line in lines)
    # Each refusal once, the kernels that gave it in one line; statuses explained; 120 columns.
    assert sum("not run, no CUDA device:" in line for line in lines) == 1
    assert any("statuses: not_verified" in line for line in lines)
    assert [line for line in lines if len(line) > 120] == []


def test_baseline_picks_the_summarys_yardstick(tmp_path):
    result = run_attnreplay("run", "--shape", "1,2,64,32", "--kernels", "torch-math,torch-flash-cpu",
                            "--baseline", "torch-math", *FAST, check=0)
    lines = summary_lines(result.stdout)
    assert "time over torch-math's (--baseline)" in lines[0]
    assert next(line for line in lines if line.split()[:1] == ["torch-math"]).split()[4] == "1x"
    # Each call's table says it too: every other kernel's whole call over the baseline's.
    ratios = next(line for line in result.stdout.splitlines() if "whole call over" in line)
    assert re.fullmatch(r"    whole call over torch-math's:  torch-flash-cpu [0-9.e+-]+x", ratios), ratios
    result = run_attnreplay("run", "--shape", "1,2,64,32", "--kernels", "torch-math", "--baseline", "nosuch", *FAST,
                            check=0)
    assert "--baseline nosuch has no time in this run; the fastest exact kernel" in result.stdout
