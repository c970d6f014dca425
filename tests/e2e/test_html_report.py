"""The HTML report as people use it: `run --html`, `audit --html` and `attnreplay report` on a small
capture with layers and steps, each page opened in headless Chromium (Debian's
chromium-headless-shell, which scripts/setup.sh installs) with the network cut off: no script error,
every view present, every chart drawn with one mark per result (read through the DOM), the tables'
rows those of the records; and clear errors on records that are not a run's or an audit's."""
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pytest
import torch

import capture_common  # noqa: F401  (the binary's default path when ctest does not set it)
import attnreplay_h5
from conftest import FAST, load_json, run_attnreplay

VIEWS = ["summary", "speed-accuracy", "roofline", "layers", "calls", "environment"]
BROWSER = "chromium-headless-shell"


def make_capture(path):
    """4 fp32 calls: 2 steps x 2 layers, with the metadata a model's capture records."""
    rng = np.random.default_rng(1)
    calls = []
    for step in range(2):
        for layer in range(2):
            q, k, v = (torch.from_numpy(rng.standard_normal((1, 2, 64, 32)).astype(np.float32)) for _ in range(3))
            calls.append({"call_index": len(calls), "op": "aten::scaled_dot_product_attention", "q": q, "k": k,
                          "v": v, "is_causal": False, "metadata": {"layer": str(layer), "step": str(step)}})
    attnreplay_h5.write_calls(str(path), calls)


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """{name: (html path, the records it shows)} for a run's, an audit's and a two-record report."""
    folder = tmp_path_factory.mktemp("report")
    make_capture(folder / "cap.h5")
    run_attnreplay("run", folder / "cap.h5", "--kernels", "torch-math,flash-cpu,sage1-int8-cpu,torch-flash",
                   "--json", folder / "run.json", "--html", folder / "run.html", "-q", *FAST, check=0)
    run_attnreplay("audit", folder / "cap.h5", "--kernels", "flash-cpu,sage1-int8-cpu", "--cast-inputs", "bf16",
                   "--json", folder / "audit.json", "--html", folder / "audit.html", "-q", check=0)
    out = run_attnreplay("report", folder / "run.json", folder / "audit.json", "-o", folder / "both.html",
                         check=0).stdout
    assert "both.html" in out and "2 records" in out
    run, audit = load_json(folder / "run.json"), load_json(folder / "audit.json")
    return {"run": (folder / "run.html", [run]), "audit": (folder / "audit.html", [audit]),
            "both": (folder / "both.html", [run, audit])}


class Dom(HTMLParser):
    """What the test reads of the rendered page: every element's attributes, by id and by class."""

    def __init__(self):
        super().__init__()
        self.elements = []

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))

    def by_id(self, element_id):
        return next((attrs for _, attrs in self.elements if attrs.get("id") == element_id), None)

    def charts(self):
        return [attrs for tag, attrs in self.elements if tag == "svg" and "chart" in attrs.get("class", "").split()]


def rendered(path, view=""):
    """The DOM after the page's script ran in headless Chromium, offline, and the browser's log;
    `view` opens that view (the page's #fragment), laid out."""
    browser = shutil.which(BROWSER)
    assert browser, f"{BROWSER} is not installed: scripts/setup.sh installs it (Debian's package)"
    result = subprocess.run([browser, "--no-sandbox", "--disable-gpu", "--host-resolver-rules=MAP * ~NOTFOUND",
                             "--enable-logging=stderr", "--v=0", "--window-size=1280,860", "--dump-dom",
                             path.as_uri() + (f"#{view}" if view else "")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    dom = Dom()
    dom.feed(result.stdout)
    return result.stdout, result.stderr, dom


@pytest.mark.parametrize("name", ["run", "audit", "both"])
def test_the_page_needs_no_network(pages, name):
    html = pages[name][0].read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
    assert "@import" not in html and not re.search(r"url\(\s*['\"]?(https?:)?//", html)


@pytest.mark.parametrize("name", ["run", "audit", "both"])
def test_every_view_renders_without_a_script_error(pages, name):
    path, records = pages[name]
    text, log, dom = rendered(path)
    html = next(attrs for tag, attrs in dom.elements if tag == "html")
    assert html.get("data-rendered") == "ok", re.search(r'id="report-errors">[^<]*', text)
    assert "Uncaught" not in log and "CONSOLE" not in log, log[-2000:]
    for view in VIEWS:
        assert dom.by_id("view-" + view) is not None, view
    # The summary: one table per record, a row per kernel that ran.
    for i, record in enumerate(records):
        ran = {k["kernel"] for call in record["calls"] for k in call["kernels"] if k["status"] != "not_supported"}
        assert int(dom.by_id(f"summary-{i}")["data-rows"]) == len(ran)
    # Every result is a row of the calls table.
    results = sum(len(call["kernels"]) for record in records for call in record["calls"])
    assert int(dom.by_id("calls-table")["data-rows"]) == results


@pytest.mark.parametrize("name", ["run", "audit", "both"])
def test_every_chart_is_drawn_with_a_mark_per_result(pages, name):
    path, records = pages[name]
    _, _, dom = rendered(path)
    timed_with_error = sum(1 for record in records for call in record["calls"] for k in call["kernels"]
                           if k["status"] != "not_supported" and "timing" in k and k.get("error", {}).get("rel_l2", 0) > 0)
    timed = sum(1 for record in records for call in record["calls"] for k in call["kernels"]
                if k["status"] != "not_supported" and k.get("tflops", 0) > 0)
    charts = {attrs.get("id"): int(attrs["data-marks"]) for attrs in dom.charts() if attrs.get("id")}
    assert charts["chart-speed-accuracy"] == timed_with_error > 0
    assert charts["chart-roofline"] == timed > 0
    # Layers x steps: a grid per record and kernel with an error, a cell per (layer, step): 2 x 2.
    heatmaps = [int(attrs["data-marks"]) for attrs in dom.charts() if "heatmap" in attrs.get("class", "")]
    judged = sum(len({k["kernel"] for call in record["calls"] for k in call["kernels"] if "error" in k})
                 for record in records)
    assert heatmaps == [4] * judged


def test_the_roofline_draws_the_gpus_measured_ceilings(pages, tmp_path):
    # A CPU record has none: the ceilings a GPU run measured at start-up, written into it.
    record = load_json(pages["run"][0].with_suffix(".json"))
    record["environment"].update(ceiling_bf16_tflops="782", ceiling_fp8_tflops="1500", ceiling_copy_gbps="3000")
    (tmp_path / "gpu.json").write_text(json.dumps(record))
    run_attnreplay("report", tmp_path / "gpu.json", "-o", tmp_path / "gpu.html", check=0)
    _, _, dom = rendered(tmp_path / "gpu.html")
    roofline = next(attrs for attrs in dom.charts() if attrs.get("id") == "chart-roofline")
    assert roofline["data-lines"] == "2" and int(roofline["data-marks"]) > 0


def test_the_roofline_labels_do_not_overlap(pages, tmp_path):
    """Hopper's fp8 and int8 ceilings are nearly equal, and each record brings its own: the labels at
    the lines' ends are laid out apart, as headless Chromium lays them out (each label's box, read
    by the page), and the view renders to a screenshot."""
    record = load_json(pages["run"][0].with_suffix(".json"))
    record["environment"].update(ceiling_bf16_tflops="794", ceiling_fp8_tflops="1465", ceiling_int8_tops="1465",
                                 ceiling_copy_gbps="4200")
    for name in ("h200-a.json", "h200-b.json"):
        (tmp_path / name).write_text(json.dumps(record))
    run_attnreplay("report", tmp_path / "h200-a.json", tmp_path / "h200-b.json", "-o", tmp_path / "two.html", check=0)
    _, _, dom = rendered(tmp_path / "two.html", "roofline")
    roofline = next(attrs for attrs in dom.charts() if attrs.get("id") == "chart-roofline")
    assert roofline["data-lines"] == "6" and roofline.get("data-labels") == "6", roofline
    assert roofline["data-label-overlaps"] == "0"
    shot = tmp_path / "roofline.png"
    subprocess.run([shutil.which(BROWSER), "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,860",
                    f"--screenshot={shot}", (tmp_path / "two.html").as_uri() + "#roofline"], capture_output=True,
                   timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_report_of_records_of_other_kinds_is_refused_naming_the_file(tmp_path, pages):
    (tmp_path / "other.json").write_text('{"schema": "something.else", "calls": []}')
    result = run_attnreplay("report", tmp_path / "other.json", "-o", tmp_path / "r.html", check=1)
    assert "other.json" in result.stderr and "not a run's or an audit's record" in result.stderr
    assert "internal error" not in result.stderr and not (tmp_path / "r.html").exists()
    result = run_attnreplay("report", tmp_path / "missing.json", "-o", tmp_path / "r.html", check=1)
    assert "missing.json" in result.stderr
    result = run_attnreplay("report", pages["run"][0], "-o", tmp_path / "r.html", check=1)
    assert "run.html" in result.stderr and "internal error" not in result.stderr
