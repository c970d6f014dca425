"""Every error statistic and work figure in the results JSON, recomputed independently in numpy.

Inputs are made here, saved as plain .pt dicts, replayed through every kernel with their outputs
saved; numpy then computes its own fp64 reference (full score matrices and a plain softmax, not
the C++ streaming one) and the statistics of replay/judge/error_stats.h from the saved outputs.
"""

import math

import numpy as np
import pytest
import torch

from conftest import FAST, load_json, load_pt, run_attnreplay

# Each case: what the plain .pt dict holds. Shapes are small: the checks are exact, not statistical.
CASES = {
    "bf16_plain": dict(dtype=torch.bfloat16, b=2, hq=4, hkv=4, sq=24, skv=24, dqk=16, dvo=16),
    "fp32_gqa_causal": dict(dtype=torch.float32, b=1, hq=6, hkv=2, sq=20, skv=20, dqk=16, dvo=16, is_causal=True),
    # s_q < s_kv: torch's is_causal is top-left, so row i sees keys 0..i; d_vo differs from d_qk.
    "fp32_causal_cross_dvo": dict(dtype=torch.float32, b=1, hq=2, hkv=2, sq=12, skv=30, dqk=16, dvo=8,
                                  is_causal=True),
    # One (batch, row) has every key masked: the reference gives 0 there, torch may give NaN.
    "bf16_bool_mask_scale": dict(dtype=torch.bfloat16, b=2, hq=2, hkv=2, sq=16, skv=16, dqk=8, dvo=8,
                                 mask="bool", scale=0.3, fully_masked_row=True),
    "fp32_float_mask_gqa": dict(dtype=torch.float32, b=2, hq=4, hkv=1, sq=10, skv=14, dqk=8, dvo=8, mask="float"),
    "bf16_gqa_bool_mask_heads": dict(dtype=torch.bfloat16, b=1, hq=4, hkv=2, sq=9, skv=11, dqk=8, dvo=8,
                                     mask="bool_per_head"),
}

ELEMENT_SIZE = {torch.bfloat16: 2, torch.float16: 2, torch.float32: 4, torch.float64: 8}


def make_inputs(case, seed):
    g = torch.Generator().manual_seed(seed)
    c = CASES[case]
    q = torch.randn(c["b"], c["hq"], c["sq"], c["dqk"], generator=g).to(c["dtype"])
    k = torch.randn(c["b"], c["hkv"], c["skv"], c["dqk"], generator=g).to(c["dtype"])
    v = torch.randn(c["b"], c["hkv"], c["skv"], c["dvo"], generator=g).to(c["dtype"])
    call = {"q": q, "k": k, "v": v, "is_causal": c.get("is_causal", False)}
    if c.get("is_causal", False):
        call["is_causal"] = True
    if c.get("scale") is not None:
        call["scale"] = c["scale"]
    if c.get("mask") == "bool":
        mask = torch.rand(c["b"], 1, c["sq"], c["skv"], generator=g) > 0.4
        mask[..., 0] = True  # every row keeps a key ...
        if c.get("fully_masked_row"):
            mask[0, 0, 3, :] = False  # ... but this one
        call["attn_mask"] = mask
    elif c.get("mask") == "bool_per_head":
        mask = torch.rand(1, c["hq"], c["sq"], c["skv"], generator=g) > 0.5
        mask[..., -1] = True
        call["attn_mask"] = mask
    elif c.get("mask") == "float":
        # Additive, broadcast over heads; some -inf, never a whole row.
        mask = torch.randn(c["b"], 1, c["sq"], c["skv"], generator=g)
        mask[..., 1::3] = -math.inf
        call["attn_mask"] = mask
    return call


def as_f64(tensor):
    return tensor.to(torch.float64).numpy()


def numpy_scores_bias(call):
    """The additive term of every score: causality and the mask, 0 or -inf (or the float mask)."""
    q, k = call["q"], call["k"]
    sq, skv = q.shape[2], k.shape[2]
    bias = np.zeros((1, 1, sq, skv))
    if call.get("is_causal"):
        bias = bias + np.where(np.tril(np.ones((sq, skv), dtype=bool)), 0.0, -np.inf)  # top-left
    mask = call.get("attn_mask")
    if mask is not None:
        bias = bias + (np.where(mask.numpy(), 0.0, -np.inf) if mask.dtype == torch.bool else as_f64(mask))
    return bias


def numpy_reference(call):
    """Attention in float64 with full score matrices and a plain softmax."""
    q, k, v = (as_f64(call[n]) for n in "qkv")
    hq, dqk = q.shape[1], q.shape[3]
    hkv = k.shape[1]
    scale = call.get("scale") or 1.0 / math.sqrt(dqk)
    k = np.repeat(k, hq // hkv, axis=1)  # GQA: query head h uses kv head h // (hq / hkv)
    v = np.repeat(v, hq // hkv, axis=1)
    scores = np.einsum("bhid,bhjd->bhij", q, k) * scale + numpy_scores_bias(call)
    row_max = scores.max(axis=-1, keepdims=True)
    live = np.isfinite(row_max)
    weights = np.exp(scores - np.where(live, row_max, 0.0))
    total = weights.sum(axis=-1, keepdims=True)
    probabilities = np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
    return np.einsum("bhij,bhjd->bhid", probabilities, v)  # fully masked rows: 0, as documented


def numpy_stats(output, reference, rows=None):
    """replay/judge/error_stats.h, from its documented definitions (docs/metrics.md), over the
    (batch, head, row) triples `rows` marks (every row when None)."""
    counted = np.ones(output.shape, dtype=bool) if rows is None else np.broadcast_to(rows[..., None], output.shape)
    finite = np.isfinite(output) & counted
    o, r = output[finite], reference[finite]
    e = np.abs(o - r)
    worst = np.unravel_index(np.argmax(np.where(finite, np.abs(output - reference), -1.0)), output.shape)
    both_zero = not o.any() and not r.any()
    return {
        "elements": int(finite.sum()),
        "nan_count": int((np.isnan(output) & counted).sum()),
        "inf_count": int((np.isinf(output) & counted).sum()),
        "max_abs": e.max(),
        "mean_abs": e.mean(),
        "mse": np.mean(e * e),
        "rmse": math.sqrt(np.mean(e * e)),
        "std_abs": e.std(),
        "rel_l1": e.sum() / np.abs(r).sum(),
        "rel_l2": math.sqrt((e * e).sum()) / math.sqrt((r * r).sum()),
        # FlashInfer-Bench's (bench/utils.py compute_error_stats), in fp64 here.
        "max_rel": (e / (np.abs(r) + 1e-8)).max(),
        "beyond_tolerance": int(((e > 1e-2) & (e / (np.abs(r) + 1e-8) > 1e-2)).sum()),
        "cosine": 1.0 if both_zero else (o * r).sum() / (math.sqrt((o * o).sum()) * math.sqrt((r * r).sum())),
        "worst": dict(zip(("batch", "head", "row", "channel"), map(int, worst))),
        "output": {"min": o.min(), "max": o.max(), "mean": o.mean(), "std": o.std()},
        "reference": {"min": r.min(), "max": r.max(), "mean": r.mean(), "std": r.std()},
    }


def assert_close(name, got, want, atol=1e-12):
    # 1e-6 relative; an absolute floor for values that are ~0 (the reference against itself
    # is exactly 0 in C++, ~1e-16 against numpy's own reference).
    assert got is not None, f"{name}: JSON has null, numpy says {want}"
    assert abs(got - want) <= max(1e-6 * abs(want), atol), f"{name}: JSON {got!r}, numpy {want!r}"


def attended_pairs(sq, skv, causal):
    # Top-left causal with the diagonal counted half (docs/metrics.md).
    if not causal:
        return sq * skv
    return sq * sq / 2 if sq <= skv else skv * (2 * sq - skv) / 2


@pytest.fixture(scope="module", params=sorted(CASES))
def replayed(request, tmp_path_factory):
    """(case, inputs, results JSON call, saved outputs folder) of one case, run once."""
    case = request.param
    folder = tmp_path_factory.mktemp(case)
    call = make_inputs(case, seed=sorted(CASES).index(case))
    torch.save(call, folder / "call.pt")
    result = run_attnreplay("run", folder / "call.pt", "--kernels", "all,reference", "--json", folder / "out.json",
                            "--save-outputs", folder / "outs", "-q", *FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    report = load_json(folder / "out.json")
    assert len(report["calls"]) == 1 and not report["input_errors"]
    return case, call, report["calls"][0], folder / "outs"


def ran_kernels(json_call):
    return [k for k in json_call["kernels"] if k["status"] != "not_supported"]


def test_every_cpu_kernel_ran(replayed):
    _, _, json_call, _ = replayed
    names = {k["kernel"]: k["status"] for k in json_call["kernels"]}
    assert {"reference", "torch-math", "torch-flash-cpu"} <= set(names), names
    assert names["reference"] == "not_verified" and names["torch-math"] == "not_verified"
    assert all(status in ("not_verified", "not_supported") for status in names.values()), names


def test_cpp_reference_matches_numpy_reference(replayed):
    # The saved output of the 'reference' kernel is the reference itself, in fp64.
    _, call, _, outs = replayed
    saved = load_pt(outs / "call0_reference.pt")["out"]
    assert saved.dtype == torch.float64
    np.testing.assert_allclose(saved.numpy(), numpy_reference(call), rtol=0, atol=1e-12)


def rows_seeing_a_key(call, shape):
    """(b, h, sq) bools: a row sees a key when a score of it is not masked (numpy's own bias)."""
    return np.broadcast_to(np.isfinite(numpy_scores_bias(call)).any(axis=-1), shape[:3])


def assert_figures_equal(label, got, want):
    for field in ("elements", "nan_count", "inf_count", "beyond_tolerance"):
        assert got[field] == want[field], f"{label} {field}: JSON {got[field]}, numpy {want[field]}"
    for field in ("max_abs", "mean_abs", "rmse", "std_abs", "rel_l1", "rel_l2", "cosine", "max_rel"):
        assert_close(f"{label} {field}", got[field], want[field])
    assert_close(f"{label} mse", got["mse"], want["mse"], atol=1e-24)  # a square: its own floor
    for side in ("output", "reference"):
        for moment in ("min", "max", "mean", "std"):
            assert_close(f"{label} {side}.{moment}", got[side][moment], want[side][moment])
    if want["max_abs"] > 1e-9:  # where the max sits is only defined when there is an error
        assert got["worst"] == want["worst"], label


def test_json_statistics_equal_numpy(replayed):
    """Every figure over the rows that see a key; where some row sees none, the whole call's beside."""
    case, call, json_call, outs = replayed
    reference = numpy_reference(call)
    sees_key = rows_seeing_a_key(call, reference.shape)
    for kernel in ran_kernels(json_call):
        name = kernel["kernel"]
        saved = load_pt(outs / f"call0_{name}.pt")
        assert saved["kernel"] == name
        output = saved["out"]
        assert tuple(output.shape) == reference.shape, name
        got = kernel["error"]
        assert got["rows_compared"] == CASES[case]["sq"] and got["sampled"] is False
        assert_figures_equal(f"{case} {name}", got, numpy_stats(as_f64(output), reference, sees_key))
        if sees_key.all():
            assert "including_rows_without_a_key" not in got and "no_key_rows" not in got, name
            continue
        assert got["no_key_rows"] == int((~sees_key).sum())
        assert_figures_equal(f"{case} {name} (every row)", got["including_rows_without_a_key"],
                             numpy_stats(as_f64(output), reference))


def test_fully_masked_row_is_reported(replayed):
    case, _, json_call, _ = replayed
    masked_notes = [n for n in json_call["notes"] if "every key masked" in n]
    if not CASES[case].get("fully_masked_row"):
        assert masked_notes == []
        return
    heads = CASES[case]["hq"]
    # Mask (b, 1, s, s) broadcasts over heads: one masked row is a (batch, head, row) triple per head.
    assert any(n.startswith(f"{heads} (batch, head, row) triples") for n in masked_notes), json_call["notes"]


def test_reference_has_zero_error_against_itself(replayed):
    _, _, json_call, _ = replayed
    error = next(k for k in json_call["kernels"] if k["kernel"] == "reference")["error"]
    for field in ("max_abs", "mean_abs", "mse", "rmse", "std_abs", "rel_l1", "rel_l2", "nan_count", "inf_count"):
        assert error[field] == 0, (field, error[field])
    assert error["cosine"] == pytest.approx(1.0, abs=1e-15)
    assert error["output"] == error["reference"]


def test_work_matches_formula(replayed):
    case, call, json_call, _ = replayed
    c = CASES[case]
    pairs = attended_pairs(c["sq"], c["skv"], c.get("is_causal", False))
    flops = 2 * c["b"] * c["hq"] * pairs * (c["dqk"] + c["dvo"])
    size = ELEMENT_SIZE[c["dtype"]]
    q, k, v = (call[n].numel() for n in "qkv")
    o = c["b"] * c["hq"] * c["sq"] * c["dvo"]
    nbytes = (q + k + v + o) * size  # the mask is not counted (docs/metrics.md)
    work = json_call["work"]
    assert work["flops"] == pytest.approx(flops, rel=1e-12)
    assert work["bytes"] == pytest.approx(nbytes, rel=1e-12)
    assert work["arithmetic_intensity"] == pytest.approx(flops / nbytes, rel=1e-12)
    for kernel in ran_kernels(json_call):
        median = kernel["timing"]["median_s"]
        assert kernel["tflops"] == pytest.approx(flops / median / 1e12, rel=1e-9)
        assert kernel["gbytes_per_s"] == pytest.approx(nbytes / median / 1e9, rel=1e-9)


def test_call_description(replayed):
    case, call, json_call, _ = replayed
    c = CASES[case]
    assert json_call["shape"] == {"batch": c["b"], "heads_q": c["hq"], "heads_kv": c["hkv"], "seq_q": c["sq"],
                                  "seq_kv": c["skv"], "head_dim_qk": c["dqk"], "head_dim_vo": c["dvo"]}
    assert json_call["dtype"] == str(c["dtype"]).removeprefix("torch.")
    assert json_call["is_causal"] == c.get("is_causal", False)
    assert json_call["scale"] == pytest.approx(c.get("scale") or 1 / math.sqrt(c["dqk"]), rel=1e-15)
    mask = call.get("attn_mask")
    want_mask = "none" if mask is None else \
        f"{str(mask.dtype).removeprefix('torch.')} {'x'.join(map(str, mask.shape))}"
    assert json_call["mask"] == want_mask
