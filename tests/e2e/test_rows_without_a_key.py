"""Rows that see no key (a padded batch's pads) have no defined output: every figure that judges a
kernel leaves them out (the error figures, the run's summary, --refcheck, the report's views, audit's
verdicts, compare), and the whole call's figures stand beside them, named as including those rows.
The kernel judged writes attention over every key and a NaN there, as cuDNN's backend writes values."""
import json
import re
from pathlib import Path

import pytest
import torch

from conftest import FAST, load_json, run_attnreplay

PLUGIN = ["--kernel-module", Path(__file__).parent / "plugins" / "undefined_rows.py"]
PADS = 5


@pytest.fixture(scope="module")
def padded_call(tmp_path_factory):
    """fp32, 2 x 2 x 32 x 16; batch 1's first PADS rows see no key (a left-padded prompt's pads)."""
    folder = tmp_path_factory.mktemp("padded")
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 32, 16, generator=g) for _ in range(3))
    mask = torch.ones(2, 1, 32, 32, dtype=torch.bool)
    mask[1, :, :, :PADS] = False
    mask[1, :, :PADS, :] = False
    torch.save({"q": q, "k": k, "v": v, "attn_mask": mask}, folder / "call.pt")
    return folder / "call.pt"


def kernel_of(call, name):
    return next(k for k in call["kernels"] if k["kernel"] == name)


def test_error_figures_refcheck_and_summary_leave_out_undefined_rows(padded_call, tmp_path):
    result = run_attnreplay("run", padded_call, *PLUGIN, "--kernels", "undefined-rows,torch-math", "--refcheck",
                            "--json", tmp_path / "r.json", "--html", tmp_path / "r.html", *FAST, check=0)
    row = kernel_of(load_json(tmp_path / "r.json")["calls"][0], "undefined-rows")
    error = row["error"]
    assert row["status"] == "passed", row["reason"]
    assert error["no_key_rows"] == 2 * PADS and error["nan_count"] == 0 and error["rel_l2"] < 1e-6, error
    whole = error["including_rows_without_a_key"]
    assert whole["nan_count"] == 1 and whole["rel_l2"] > 0.1, whole
    # The table says what the figures leave out and gives the whole call's beside them.
    assert "figures over the rows that see a key; the whole call, its 10 undefined rows" in result.stdout
    # The run's summary: median and worst over the rows that see a key.
    summary = next(line for line in result.stdout.splitlines() if line.strip().startswith("undefined-rows"))
    worst = float(summary.split()[-3])
    assert worst < 1e-6, summary
    # The report's rows carry the judged figure and the whole call's beside it.
    page = (tmp_path / "r.html").read_text()
    rows = re.findall(r'"kernel":"undefined-rows".*?"rel_l2":([^,}]+)', page)
    assert rows and all(float(x) < 1e-6 for x in rows), rows
    assert '"rel_l2_every_row":' in page and "rel_l2 with undefined rows" in page


def test_audit_and_compare_judge_the_rows_that_see_a_key(padded_call, tmp_path):
    run_attnreplay("audit", padded_call, *PLUGIN, "--kernels", "undefined-rows", "--json", tmp_path / "a.json",
                   *FAST, check=0)
    audit = load_json(tmp_path / "a.json")
    [kernel] = audit["kernels"]
    assert kernel["verdict"] == "passed", kernel
    assert kernel["errors"]["rel_l2"]["max"] < 1e-6
    worst = kernel["worst_calls"][0]
    assert worst["error"]["rel_l2"] < 1e-6 and all(h["rel_l2"] < 1e-6 for h in worst["per_head"]), worst
    assert audit["shapes"][0]["kernels"][0]["median_rel_l2"] < 1e-6
    error = audit["calls"][0]["kernels"][0]["error"]
    assert error["rel_l2"] < 1e-6 and error["including_rows_without_a_key"]["rel_l2"] > 0.1
    # compare reads the judged figure: the same kernel against itself is not less accurate, and a
    # record written before schema 3 (whole-call figures in "error", the others in
    # "rows_with_a_key") reads the same.
    run_attnreplay("run", padded_call, *PLUGIN, "--kernels", "undefined-rows", "--json", tmp_path / "b.json", *FAST,
                   check=0)
    record = load_json(tmp_path / "b.json")
    old = json.loads(json.dumps(record))
    error = kernel_of(old["calls"][0], "undefined-rows")["error"]
    error["rows_with_a_key"] = {key: error[key] for key in ("elements", "max_abs", "mean_abs", "rel_l2", "cosine")}
    error.update(error.pop("including_rows_without_a_key"))
    (tmp_path / "old.json").write_text(json.dumps(old))
    out = run_attnreplay("compare", tmp_path / "old.json", tmp_path / "b.json", "-v", "--fail-on-regression", "25",
                         check=0).stdout
    assert "LESS ACCURATE" not in out
    line = next(line for line in out.splitlines() if line.startswith("undefined-rows"))
    assert float(line.split()[-3]) < 1e-6 and float(line.split()[-1]) < 1e-6, line
