"""`attnreplay audit` on a small capture whose K has channels with large means (as real LLM keys
do) in some calls and not in others, with layer and step metadata: the JSON's structure, its
distributions and worst calls against its own per-call figures, K smoothing's effect on the Sage
kind, the random-input comparison, the attribution by quantization step, the CSV, exit codes, a
rerun command, and the plot script."""

import csv
import importlib.util
import shlex
import subprocess
import sys

import numpy as np
import pytest
import torch

import capture_common  # noqa: F401  (the binary's default path when ctest does not set it)
import attnreplay_h5
from conftest import SOURCE_DIR, load_json, run_attnreplay

BATCH, HEADS, SEQ, DIM = 1, 2, 96, 32
OUTLIER_MEAN = 20.0


def registered_kernels():
    listed = run_attnreplay("kernels", check=0).stdout.split("\n")
    return {line.split()[0] for line in listed if line.strip()}


def audited_kernels():
    """reference, flash-cpu and sage1-int8-cpu, and the other CPU emulations where registered."""
    wanted = ["reference", "flash-cpu", "sage1-int8-cpu", "sage2-int8-fp8-cpu", "fa3-fp8-cpu"]
    known = registered_kernels()
    missing = {"reference", "flash-cpu", "sage1-int8-cpu"} - known
    assert not missing, f"not registered: {missing}"
    return [k for k in wanted if k in known]


def make_capture(path):
    """6 bf16 calls: 2 steps x 3 layers; layers 1 and 2 have K channels 0-2 offset by a large mean
    (layer 2 the larger), layer 0 is plain normal. Layer 2 is causal, so that it is a shape of its own."""
    rng = np.random.default_rng(0)
    calls = []
    for step in range(2):
        for layer in range(3):
            q, k, v = (rng.standard_normal((BATCH, HEADS, SEQ, DIM)) for _ in range(3))
            if layer > 0:
                k[..., :3] += OUTLIER_MEAN * layer
            calls.append({"call_index": len(calls), "op": "aten::scaled_dot_product_attention",
                          "q": torch.from_numpy(q).to(torch.bfloat16), "k": torch.from_numpy(k).to(torch.bfloat16),
                          "v": torch.from_numpy(v).to(torch.bfloat16), "is_causal": layer == 2,
                          "metadata": {"layer": str(layer), "step": str(step)}})
    attnreplay_h5.write_calls(str(path), calls)
    return calls


def kernel_of(call, name):
    return next(k for k in call["kernels"] if k["kernel"] == name)


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """The capture audited once with --random-compare and --attribute: (result, JSON, folder)."""
    folder = tmp_path_factory.mktemp("audit")
    make_capture(folder / "cap.h5")
    kernels = audited_kernels()
    # fa3's FP8 K without smoothing exceeds its thresholds on these keys: judge only the others here.
    result = run_attnreplay("audit", folder / "cap.h5", "--kernels", ",".join(kernels), "--random-compare",
                            "--attribute", "--json", folder / "a.json", "--csv", folder / "a.csv")
    return result, load_json(folder / "a.json"), folder


def test_json_structure(audited):
    result, audit, _ = audited
    assert audit["schema"] == "attnreplay.audit" and audit["schema_version"] == 3
    assert audit["argv"][1] == "audit"
    for key in ("tool_version", "started_utc", "environment", "stopping_rule", "options", "units", "statistics",
                "kernels", "shapes", "calls", "input_errors"):
        assert key in audit, key
    assert audit["input_errors"] == []
    assert audit["options"]["quant_options"]["k_smooth"] is True
    assert [k["kernel"] for k in audit["kernels"]] == audited_kernels()
    assert len(audit["calls"]) == 6
    for position, call in enumerate(audit["calls"]):
        assert call["position"] == position
        assert call["layer"] == position % 3 and call["step"] == position // 3
        assert {k["kernel"] for k in call["kernels"]} == set(audited_kernels())
    # The quick default stopping rule still times every kernel, for the speed/accuracy chart.
    for call in audit["calls"]:
        for k in call["kernels"]:
            assert k["timing"]["samples"] >= 1 and k["timing"]["median_s"] > 0
    assert "worst calls by rel_l2" in result.stdout
    assert "captured against random inputs" in result.stdout


def test_distributions_are_the_per_call_figures_quantiles(audited):
    _, audit, _ = audited
    for kernel in audit["kernels"]:
        for statistic in audit["statistics"]:
            values = [kernel_of(c, kernel["kernel"])["error"][statistic] for c in audit["calls"]]
            d = kernel["errors"][statistic]
            assert d["count"] == 6
            assert d["min"] <= d["median"] <= d["p99"] <= d["max"]
            # numpy's default (linear) percentile: what the audit promises.
            want = np.percentile(values, [0, 50, 99, 100])
            np.testing.assert_allclose([d["min"], d["median"], d["p99"], d["max"]], want, rtol=1e-12, atol=1e-300)


def test_worst_calls_are_the_worst_with_per_head_errors(audited):
    _, audit, _ = audited
    for kernel in audit["kernels"]:
        if kernel["kernel"] == "reference":
            assert kernel["worst_calls"] == []  # exact by construction
            continue
        per_call = sorted(((kernel_of(c, kernel["kernel"])["error"]["rel_l2"], c["position"]) for c in audit["calls"]),
                          key=lambda item: -item[0])
        worst = kernel["worst_calls"]
        assert len(worst) == 5  # --worst default
        assert [w["error"]["rel_l2"] for w in worst] == [e for e, _ in per_call[:5]]
        for w in worst:
            call = audit["calls"][w["call"]]
            assert (w["call_index"], w["layer"], w["step"]) == (call["call_index"], call["layer"], call["step"])
            assert len(w["per_head"]) == BATCH * HEADS
            heads = [h["rel_l2"] for h in w["per_head"]]
            # The whole call's rel_l2 is a weighted mean of its heads' (in squares).
            assert min(heads) * (1 - 1e-9) <= w["error"]["rel_l2"] <= max(heads) * (1 + 1e-9)
            assert all(0.9 < h["cosine"] <= 1 + 1e-12 for h in w["per_head"])


def test_verdicts_and_exit_codes(audited, tmp_path):
    result, audit, folder = audited
    verdicts = {k["kernel"]: k for k in audit["kernels"]}
    for name in ("reference", "flash-cpu", "sage1-int8-cpu"):
        assert verdicts[name]["verdict"] == "passed", verdicts[name]
        assert verdicts[name]["calls_judged"] == 6 and verdicts[name]["calls_failing"] == 0
    failing = [k for k in audit["kernels"] if k["verdict"] == "failed"]
    assert result.returncode == (3 if failing else 0), result.stdout + result.stderr
    for k in failing:  # the count is the calls whose kernel status is 'incorrect'
        incorrect = sum(kernel_of(c, k["kernel"])["status"] == "incorrect" for c in audit["calls"])
        assert k["calls_failing"] == incorrect > 0
    # An impossible threshold fails every kernel but the exact reference: exit 3, JSON still written.
    strict = run_attnreplay("audit", folder / "cap.h5", "--kernels", "reference,flash-cpu", "--refcheck-max-rel-l2",
                            "1e-9", "--json", tmp_path / "strict.json", "-q")
    assert strict.returncode == 3, strict.stdout + strict.stderr
    strict_verdicts = {k["kernel"]: k["verdict"] for k in load_json(tmp_path / "strict.json")["kernels"]}
    assert strict_verdicts == {"reference": "passed", "flash-cpu": "failed"}
    assert "6 calls, 2 kernels: 1 failed, 1 passed; 0 input errors" in strict.stdout
    # Bad usage is 2; a missing input is 1.
    assert run_attnreplay("audit", folder / "cap.h5", "--kernels", "nosuch").returncode == 2
    assert run_attnreplay("audit", folder / "cap.h5", "--cast-inputs", "int8").returncode == 2
    assert run_attnreplay("audit", tmp_path / "missing.h5", "--kernels", "reference").returncode == 1


def test_k_smoothing_is_what_keeps_sage1_accurate_on_outlier_keys(audited, tmp_path):
    _, smoothed, folder = audited
    run_attnreplay("audit", folder / "cap.h5", "--kernels", "sage1-int8-cpu", "--no_k_smooth", "--random-compare",
                   "--json", tmp_path / "raw.json", "-q")
    raw = load_json(tmp_path / "raw.json")
    assert raw["options"]["quant_options"]["k_smooth"] is False

    def rel_l2(audit, layer):
        return [kernel_of(c, "sage1-int8-cpu")["error"]["rel_l2"] for c in audit["calls"] if c["layer"] == layer]

    # On the outlier layers smoothing changes the answer several times over; on plain keys it does not.
    for layer in (1, 2):
        assert min(rel_l2(raw, layer)) > 3 * max(rel_l2(smoothed, layer)), layer
    assert max(rel_l2(raw, 0)) < 2 * min(rel_l2(smoothed, 0))
    # Random inputs have no outliers: without smoothing the captured calls are much worse than random
    # ones of their shape (the causal shape holds only outlier calls).
    causal = next(g for g in raw["shapes"] if g["is_causal"])
    assert causal["kernels"][0]["captured_over_random_rel_l2"] > 3
    assert causal["kernels"][0]["captured_vs_random_range"] == "above"


def test_random_comparison_beside_each_shape(audited):
    _, audit, _ = audited
    assert len(audit["shapes"]) == 2
    assert sorted(p for g in audit["shapes"] for p in g["calls"]) == list(range(6))
    for group in audit["shapes"]:
        assert group["shape"] == {"batch": BATCH, "heads_q": HEADS, "heads_kv": HEADS, "seq_q": SEQ, "seq_kv": SEQ,
                                  "head_dim_qk": DIM, "head_dim_vo": DIM}
        assert group["dtype"] == "bfloat16"
        # One random call per seed (--seed 0 and on), each rerunnable with its own seed.
        random_calls = group["random_calls"]
        assert len(random_calls) == audit["options"]["random_seeds"] == 3
        for seed, random_call in enumerate(random_calls):
            assert random_call["op"] == "generated" and random_call["is_causal"] == group["is_causal"]
            assert all(f"--seed {seed} " in k["rerun"] + " " and k["rerun"].count("--seed") == 1
                       for k in random_call["kernels"])
        for summary in group["kernels"]:
            captured = [kernel_of(audit["calls"][p], summary["kernel"])["error"]["rel_l2"] for p in group["calls"]]
            assert summary["median_rel_l2"] == pytest.approx(float(np.median(captured)), rel=1e-12)
            random = [kernel_of(c, summary["kernel"])["error"]["rel_l2"] for c in random_calls]
            assert summary["random"]["calls"] == 3
            assert summary["random"]["rel_l2"] == pytest.approx(float(np.median(random)), rel=1e-12)
            assert (summary["random"]["rel_l2_min"], summary["random"]["rel_l2_max"]) == (min(random), max(random))
            expected = ("above" if summary["median_rel_l2"] > max(random) else
                        "below" if summary["median_rel_l2"] < min(random) else "within")
            assert summary["captured_vs_random_range"] == expected
            if np.median(random) > 0:
                assert summary["captured_over_random_rel_l2"] == pytest.approx(
                    summary["median_rel_l2"] / np.median(random), rel=1e-12)
                assert len(set(random)) == 3, random  # the seeds draw different inputs
            else:
                assert summary["captured_over_random_rel_l2"] is None  # the reference against itself


def test_attribution_by_quantization_step_and_input_diagnostics(audited):
    _, audit, _ = audited
    for kernel in audit["kernels"]:
        for worst in kernel["worst_calls"]:
            stages = [s["stages"] for s in worst["attribution"]]
            assert stages == ["none", "qk", "qk+p", "qk+p+pv"], (kernel["kernel"], worst)
            # With every step on, the staged emulation is the kernel itself.
            assert worst["attribution"][-1]["rel_l2"] == pytest.approx(worst["error"]["rel_l2"], rel=1e-6)
            # With none, only fp32 arithmetic and the output's rounding remain: below every kernel.
            assert worst["attribution"][0]["rel_l2"] <= worst["error"]["rel_l2"] * (1 + 1e-6)
    # Sage1's error comes from the INT8 Q·Kᵀ, not from P.
    sage1 = next(k for k in audit["kernels"] if k["kernel"] == "sage1-int8-cpu")
    for worst in sage1["worst_calls"]:
        by_stage = {s["stages"]: s["rel_l2"] for s in worst["attribution"]}
        assert by_stage["qk"] > 3 * by_stage["none"]
        assert by_stage["qk+p+pv"] < 1.2 * by_stage["qk"]
    # Every call has diagnostics; the outlier channels show in K's channel means, growing with the offset.
    ratio = {}
    for call in audit["calls"]:
        d = call["diagnostics"]
        assert d["k_mean_outlier_ratio"] >= 1 and d["q_amax_spread"] >= 1 and d["k_amax_spread"] >= 1
        ratio.setdefault(call["layer"], []).append(d["k_mean_over_std"])
        if call["layer"] > 0:
            assert d["k_outlier"]["channel"] in (0, 1, 2)
    assert min(ratio[1]) > 5 * max(ratio[0])
    assert min(ratio[2]) > 1.5 * max(ratio[1])


def test_csv_rows_and_a_rerun_command(audited, tmp_path):
    _, audit, folder = audited
    with open(folder / "a.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    kernels = audited_kernels()
    assert len(rows) == 6 * len(kernels)
    assert [(int(r["call_index"]), r["kernel"]) for r in rows] == [(i, k) for i in range(6) for k in kernels]
    for row in rows:
        call = audit["calls"][int(row["call_index"])]
        assert (int(row["layer"]), int(row["step"]), row["op"]) == (call["layer"], call["step"], call["op"])
        assert float(row["rel_l2"]) == kernel_of(call, row["kernel"])["error"]["rel_l2"]
        assert float(row["k_mean_outlier_ratio"]) == call["diagnostics"]["k_mean_outlier_ratio"]
    # A row's rerun command is an audit of that call and kernel, with the same error.
    row = next(r for r in rows if r["kernel"] == "sage1-int8-cpu" and r["call_index"] == "4")
    argv = shlex.split(row["rerun"])
    assert argv[:2] == ["attnreplay", "audit"] and "--calls" in argv
    run_attnreplay(*argv[1:], "--json", tmp_path / "again.json", "-q", check=0)
    (again,) = load_json(tmp_path / "again.json")["calls"]
    assert kernel_of(again, "sage1-int8-cpu")["error"]["rel_l2"] == float(row["rel_l2"])


def test_cast_inputs_lets_fp32_captures_reach_the_bf16_kernels(tmp_path):
    rng = np.random.default_rng(1)
    attnreplay_h5.write_calls(str(tmp_path / "f32.h5"), [
        {"call_index": 0, "q": rng.standard_normal((1, 2, 40, 16)).astype(np.float32),
         "k": rng.standard_normal((1, 2, 40, 16)).astype(np.float32),
         "v": rng.standard_normal((1, 2, 40, 16)).astype(np.float32),
         "out": rng.standard_normal((1, 2, 40, 16)).astype(np.float32)}])
    # As captured: the kernel declines fp32 (not_run), and the made-up model output fails (exit 3).
    run_attnreplay("audit", tmp_path / "f32.h5", "--kernels", "sage1-int8-cpu", "--json", tmp_path / "as_is.json",
                   "-q", check=3)
    as_is = load_json(tmp_path / "as_is.json")
    assert kernel_of(as_is["calls"][0], "sage1-int8-cpu")["status"] == "not_supported"
    assert {k["kernel"]: k["verdict"] for k in as_is["kernels"]} == {"sage1-int8-cpu": "not_run",
                                                                     "model-output": "failed"}
    run_attnreplay("audit", tmp_path / "f32.h5", "--kernels", "sage1-int8-cpu", "--cast-inputs", "bf16", "--json",
                   tmp_path / "cast.json", "-q", check=0)
    (cast,) = load_json(tmp_path / "cast.json")["calls"]
    assert cast["dtype"] == "bfloat16"
    assert kernel_of(cast, "sage1-int8-cpu")["status"] == "passed"
    assert "--cast-inputs bfloat16" in kernel_of(cast, "sage1-int8-cpu")["rerun"]
    # The model's fp32 output belongs to other inputs: it is not compared.
    assert all(k["kernel"] != "model-output" for k in cast["kernels"])
    assert any("cast from float32 to bfloat16" in note for note in cast["notes"])


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib is not installed")
def test_plot_script_draws_every_chart(audited, tmp_path):
    _, audit, folder = audited
    result = subprocess.run([sys.executable, str(SOURCE_DIR / "scripts" / "plot_audit.py"), str(folder / "a.json"),
                             "--out", str(tmp_path / "plots")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    names = {p.name for p in (tmp_path / "plots").iterdir()}
    expected = {"error_by_call.png", "error_by_layer.png", "error_by_step.png"}
    expected |= {f"speed_accuracy_{n}.png" for n in range(len(audit["shapes"]))}
    assert names == expected
    for name in names:
        assert (tmp_path / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
