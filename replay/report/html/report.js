// The attnreplay report's script: draws the tables and SVG charts from the records embedded in the
// page (replay/report/html_report.cpp), with nothing fetched. When it is done, <html> carries
// data-rendered="ok", or "error" with the messages in #report-errors: what the browser test reads.
"use strict";

(function () {
  const SVG_NS = "http://www.w3.org/2000/svg";
  const PALETTE = ["#2f5fb3", "#d1495b", "#3a9d5d", "#e09f3e", "#7b4ea3", "#1f9bb0", "#8c564b", "#c2419b",
                   "#6b7a8f", "#a3a13a"];
  const MARKERS = ["circle", "square", "triangle", "diamond"];
  const errors = [];

  function fail(message) {
    errors.push(String(message));
    let box = document.getElementById("report-errors");
    if (!box) document.body.prepend(box = el("div", { id: "report-errors" }));
    box.textContent = "The report's script failed: " + errors.join("; ");
    document.documentElement.dataset.rendered = "error";
  }
  window.addEventListener("error", (event) => fail(event.message));

  // ---- small builders ----
  function el(tag, attributes, children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attributes || {})) {
      if (key === "text") node.textContent = value;
      else if (key === "className") node.className = value;
      else node.setAttribute(key, value);
    }
    for (const child of children || []) node.append(child);
    return node;
  }
  function svg(tag, attributes, text) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [key, value] of Object.entries(attributes || {})) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // ---- numbers, one format per kind of figure (as the terminal tables) ----
  const isNumber = (x) => typeof x === "number" && isFinite(x);
  const g = (x, digits) => (isNumber(x) ? Number(x.toPrecision(digits || 3)).toString() : "-");
  const ms = (s) => (isNumber(s) ? (s * 1e3).toPrecision(4) : "-");
  function cosineText(c) {
    if (!isNumber(c)) return "-";
    const off = c - 1;
    if (Math.abs(off) <= 4 * Number.EPSILON) return "1";
    if (Math.abs(off) <= 1e-4) return "1" + (off < 0 ? "-" : "+") + Math.abs(off).toExponential(1);
    return c.toFixed(6);
  }
  const times = (x) => (isNumber(x) ? g(x, 3) + "x" : "-");
  // Not Math.min(...values): a capture's hundreds of thousands of results overflow the call stack.
  const minOf = (values) => values.reduce((a, b) => Math.min(a, b), Infinity);
  const maxOf = (values) => values.reduce((a, b) => Math.max(a, b), -Infinity);

  // ---- the data ----
  const pages = JSON.parse(document.getElementById("report-data").textContent);
  // Colours go to the kernels that ran, so that the refusals do not use them up.
  const kernelNames = [...new Set(pages.flatMap((p) => p.rows.filter((r) => r.status !== "not_supported").map((r) => r.kernel)))].sort();
  const colorOf = (kernel) => PALETTE[Math.max(0, kernelNames.indexOf(kernel)) % PALETTE.length];
  const markerOf = (pageIndex) => MARKERS[pageIndex % MARKERS.length];
  const timedRows = (page) => page.rows.filter((r) => isNumber(r.call_s) && r.status !== "not_supported");

  // ---- charts ----
  // A log axis from lo to hi onto [a, b], its ticks at powers of ten (and 2, 5 between them when
  // the range is short).
  function logAxis(lo, hi, a, b) {
    let l = Math.floor(Math.log10(lo)), h = Math.ceil(Math.log10(hi));
    if (h === l) h = l + 1;
    const map = (v) => a + ((Math.log10(v) - l) / (h - l)) * (b - a);
    const ticks = [];
    for (let e = l; e <= h; ++e) {
      for (const m of h - l <= 2 ? [1, 2, 5] : [1]) {
        const v = m * Math.pow(10, e);
        if (v >= Math.pow(10, l) && v <= Math.pow(10, h)) ticks.push(v);
      }
    }
    return { map, ticks, lo: Math.pow(10, l), hi: Math.pow(10, h) };
  }

  function marker(shape, x, y, color, title) {
    const r = 4.5;
    let node;
    if (shape === "square") node = svg("rect", { x: x - r, y: y - r, width: 2 * r, height: 2 * r });
    else if (shape === "triangle") node = svg("polygon", { points: `${x},${y - r - 1} ${x - r},${y + r} ${x + r},${y + r}` });
    else if (shape === "diamond") node = svg("polygon", { points: `${x},${y - r - 1} ${x + r + 1},${y} ${x},${y + r + 1} ${x - r - 1},${y}` });
    else node = svg("circle", { cx: x, cy: y, r });
    node.setAttribute("fill", color);
    node.setAttribute("fill-opacity", "0.75");
    node.setAttribute("stroke", "#1d2330");
    node.setAttribute("stroke-width", "0.5");
    node.setAttribute("class", "mark");
    node.append(svg("title", {}, title));
    return node;
  }

  // points: [{x, y, color, shape, title}]; lines: [{points: [[x, y], ...], color, dash, label}].
  // Both axes logarithmic. data-marks counts the points drawn.
  function logChart({ id, xLabel, yLabel, points, lines }) {
    const W = 760, H = 440, left = 70, right = 20, top = 16, bottom = 46;
    const xs = points.map((p) => p.x).concat((lines || []).flatMap((l) => l.points.map((q) => q[0])));
    const ys = points.map((p) => p.y).concat((lines || []).flatMap((l) => l.points.map((q) => q[1])));
    const X = logAxis(minOf(xs), maxOf(xs), left, W - right);
    const Y = logAxis(minOf(ys), maxOf(ys), H - bottom, top);
    const chart = svg("svg", { class: "chart", id, viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img" });
    for (const t of X.ticks) {
      chart.append(svg("line", { class: "grid", x1: X.map(t), x2: X.map(t), y1: top, y2: H - bottom }));
      chart.append(svg("text", { x: X.map(t), y: H - bottom + 14, "text-anchor": "middle" }, g(t, 2)));
    }
    for (const t of Y.ticks) {
      chart.append(svg("line", { class: "grid", x1: left, x2: W - right, y1: Y.map(t), y2: Y.map(t) }));
      chart.append(svg("text", { x: left - 6, y: Y.map(t) + 4, "text-anchor": "end" }, g(t, 2)));
    }
    chart.append(svg("rect", { class: "axis", x: left, y: top, width: W - left - right, height: H - top - bottom, fill: "none" }));
    chart.append(svg("text", { x: (left + W - right) / 2, y: H - 8, "text-anchor": "middle" }, xLabel));
    chart.append(svg("text", { x: 14, y: (top + H - bottom) / 2, transform: `rotate(-90 14 ${(top + H - bottom) / 2})`,
                               "text-anchor": "middle" }, yLabel));
    const clip = (v, axis) => Math.min(Math.max(v, axis.lo), axis.hi);
    const labels = [];
    for (const line of lines || []) {
      const path = line.points.map((q, i) => `${i ? "L" : "M"}${X.map(clip(q[0], X))},${Y.map(clip(q[1], Y))}`).join(" ");
      chart.append(svg("path", { d: path, stroke: line.color, "stroke-width": 1.5, fill: "none",
                                 "stroke-dasharray": line.dash || "" }));
      const end = line.points[line.points.length - 1];
      labels.push({ line, x: X.map(clip(end[0], X)) - 4, y: Y.map(clip(end[1], Y)) - 5 });
    }
    // Each label over its line's right end, moved down where it would sit on the one above (close
    // ceilings: Hopper's fp8 and int8 rates; one set per record), and all moved up together if that
    // takes the last below the plot.
    labels.sort((a, b) => a.y - b.y);
    const lineHeight = 13;  // the 11 px labels' height, with a gap
    labels.forEach((label, i) => { if (i) label.y = Math.max(label.y, labels[i - 1].y + lineHeight); });
    const below = labels.length ? labels[labels.length - 1].y - (H - bottom - 4) : 0;
    for (const label of labels) {
      label.y -= Math.max(below, 0);
      chart.append(svg("text", { class: "line-label", x: label.x, y: label.y, "text-anchor": "end", fill: label.line.color },
                       label.line.label));
    }
    for (const p of points) chart.append(marker(p.shape, X.map(p.x), Y.map(p.y), p.color, p.title));
    chart.dataset.marks = String(points.length);
    chart.dataset.lines = String((lines || []).length);
    return chart;
  }

  function legend(kernels) {
    const box = el("div", { className: "legend" });
    for (const k of kernels) box.append(el("span", {}, [el("span", { className: "swatch", style: `background:${colorOf(k)}` }), k]));
    if (pages.length > 1) {
      const shapes = { circle: "\u25cf", square: "\u25a0", triangle: "\u25b2", diamond: "\u25c6" };
      pages.forEach((p, i) => box.append(el("span", { text: `${shapes[markerOf(i)]} ${p.name}` })));
    }
    return box;
  }

  function emptyNote(text) {
    return el("p", { className: "empty", "data-empty": "1", text });
  }

  // ---- tables ----
  // columns: [{label, value(row) -> sortable value, cell(row) -> text or node, numeric}]
  function sortableTable(columns, rows, id) {
    const table = el("table", { id });
    const body = el("tbody");
    const draw = (ordered) => {
      body.replaceChildren(...ordered.map((row) => el("tr", {}, columns.map((c) => {
        const content = c.cell ? c.cell(row) : c.value(row);
        const td = el("td", { className: (c.numeric ? "num " : "") + (c.bad && c.bad(row) ? "bad" : "") });
        td.append(content instanceof Node ? content : String(content === undefined || content === null ? "-" : content));
        return td;
      }))));
    };
    let sortedBy = -1, ascending = true;
    const header = el("tr", {}, columns.map((c, i) => {
      const th = el("th", { className: "sortable", text: c.label, title: "sort by " + c.label });
      th.addEventListener("click", () => {
        ascending = sortedBy === i ? !ascending : true;
        sortedBy = i;
        const key = (row) => c.value(row);
        draw([...rows].sort((a, b) => {
          const x = key(a), y = key(b);
          const missingX = x === null || x === undefined || x === "-", missingY = y === null || y === undefined || y === "-";
          if (missingX || missingY) return missingX - missingY;  // missing values last, either way
          const order = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y), undefined, { numeric: true });
          return ascending ? order : -order;
        }));
        table.dispatchEvent(new Event("sorted"));
      });
      return th;
    }));
    draw(rows);
    table.append(el("thead", {}, [header]), body);
    table.dataset.rows = String(rows.length);
    return table;
  }

  // ---- the views ----
  function summaryView() {
    const section = el("section", { id: "view-summary" }, [el("h2", { text: "Summary per kernel" }),
      el("p", { className: "about", text: "Over every call of each record: the kernel's time against the baseline " +
        "kernel's (the geometric mean over the calls both timed, each the whole call with its input preparation " +
        "where that was timed apart), its error against the fp64 reference, and the calls it ran, refused and failed." })]);
    const cards = el("div", { className: "cards" });
    pages.forEach((page) => {
      const s = page.summary;
      const ran = s.kernels.filter((k) => k.ran + k.failed > 0);
      const columns = [
        { label: "kernel", value: (k) => k.kernel + (k.emulation ? " (emul.)" : "") },
        { label: "ran", value: (k) => k.ran, numeric: true },
        { label: "refused", value: (k) => k.refused, numeric: true },
        { label: "failed", value: (k) => k.failed, numeric: true, bad: (k) => k.failed > 0 },
        { label: "time vs base", value: (k) => k.vs_baseline, cell: (k) => times(k.vs_baseline), numeric: true },
        { label: "speed-up", value: (k) => (isNumber(k.vs_baseline) ? 1 / k.vs_baseline : null),
          cell: (k) => (isNumber(k.vs_baseline) ? times(1 / k.vs_baseline) : "-"), numeric: true },
        { label: "median rel_l2", value: (k) => k.median_rel_l2, cell: (k) => g(k.median_rel_l2), numeric: true },
        { label: "worst rel_l2", value: (k) => k.worst_rel_l2, cell: (k) => g(k.worst_rel_l2), numeric: true },
        { label: "worst call", value: (k) => k.worst_call || "-" },
      ];
      if (page.verdicts) columns.push({ label: "verdict", value: (k) => page.verdicts[k.kernel] || "-",
                                        bad: (k) => page.verdicts[k.kernel] === "failed" });
      const notes = el("ul", { className: "notes" });
      notes.append(el("li", { text: s.baseline ? `base: ${s.baseline} (${s.baseline_note})` : "no kernel was timed" }));
      if (ran.some((k) => k.emulation)) {
        notes.append(el("li", { text: "(emul.): a CPU emulation of a GPU kernel: its outputs are that kernel's, its time is not meaningful" }));
      }
      for (const r of s.refusals) {
        notes.append(el("li", { text: `not run, ${r.reason}: ` + r.kernels.map(([k, n]) => (n === s.calls ? k : `${k} (${n} calls)`)).join(", ") }));
      }
      for (const e of page.input_errors) notes.append(el("li", { className: "bad", text: "error: " + e }));
      const gpu = page.environment.gpu && page.environment.gpu !== "none" ? page.environment.gpu : page.environment.cpu || "CPU";
      cards.append(el("div", { className: "card" }, [
        el("h3", { text: page.name }),
        el("div", { className: "meta", text: `${page.schema === "attnreplay.audit" ? "audit" : "run"} of ${s.calls} calls on ${gpu}, ` +
                                           `${page.started_utc}, attnreplay ${page.tool_version}` }),
        sortableTable(columns, ran, "summary-" + pages.indexOf(page)), notes]));
    });
    section.append(cards);
    return section;
  }

  function speedAccuracyView() {
    const section = el("section", { id: "view-speed-accuracy" }, [el("h2", { text: "Speed against accuracy" }),
      el("p", { className: "about", text: "Each call through each kernel is a point: the whole call's rate (FLOP over " +
        "its time with the input preparation) against its relative L2 error to the fp64 reference. Up and left is " +
        "less accurate; right is faster. Hover a point for its call." })]);
    const points = [];
    let exactZero = 0;
    pages.forEach((page, i) => {
      for (const r of timedRows(page)) {
        if (!isNumber(r.rel_l2) || !isNumber(r.flops) || r.flops <= 0) continue;
        if (r.rel_l2 <= 0) { ++exactZero; continue; }
        points.push({ kernel: r.kernel, x: r.flops / r.call_s / 1e12, y: r.rel_l2, color: colorOf(r.kernel), shape: markerOf(i),
                      title: `${r.kernel}, ${r.call} (${r.shape}): ${ms(r.call_s)} ms, rel_l2 ${g(r.rel_l2)}` });
      }
    });
    if (!points.length) {
      section.append(emptyNote("No call has both a time and an error."));
      return section;
    }
    section.append(legend([...new Set(points.map((p) => p.kernel))].sort()));
    section.append(logChart({ id: "chart-speed-accuracy", xLabel: "TFLOP/s of the whole call", yLabel: "rel_l2 (log)", points }));
    if (exactZero) section.append(el("p", { className: "about", text: `${exactZero} results with an error of exactly 0 are not drawn (a log axis).` }));
    return section;
  }

  function rooflineView() {
    const section = el("section", { id: "view-roofline" }, [el("h2", { text: "Roofline" }),
      el("p", { className: "about", text: "Each call through each kernel: the kernel's achieved TFLOP/s against the " +
        "call's arithmetic intensity (FLOP per byte of Q, K, V and output), under the ceilings measured on that GPU " +
        "at start-up: the dense matrix rates and the copy rate." })]);
    const points = [], lines = [];
    pages.forEach((page, i) => {
      for (const r of timedRows(page)) {
        if (!isNumber(r.tflops) || r.tflops <= 0 || !isNumber(r.flops) || !isNumber(r.bytes) || r.bytes <= 0) continue;
        points.push({ kernel: r.kernel, x: r.flops / r.bytes, y: r.tflops, color: colorOf(r.kernel), shape: markerOf(i),
                      title: `${r.kernel}, ${r.call} (${r.shape}): ${g(r.tflops)} TFLOP/s, ${g(r.flops / r.bytes)} FLOP/B` });
      }
    });
    if (!points.length) {
      section.append(emptyNote("No call was timed."));
      return section;
    }
    const lo = minOf(points.map((p) => p.x)) / 2, hi = maxOf(points.map((p) => p.x)) * 2;
    const suffix = (page) => (pages.length > 1 ? ` (${page.name})` : "");
    let any = false;
    for (const page of pages) {
      const c = page.ceilings;
      if (!c.copy_gbps) continue;
      any = true;
      for (const [key, label, dash] of [["bf16_tflops", "bf16", ""], ["fp8_tflops", "fp8", "6 3"], ["int8_tops", "int8", "2 3"]]) {
        if (!c[key]) continue;
        const knee = (c[key] * 1e3) / c.copy_gbps;  // FLOP/B where the copy rate meets the matrix rate
        lines.push({ points: [[lo, (c.copy_gbps * lo) / 1e3], [knee, c[key]], [Math.max(hi, knee * 2), c[key]]],
                     color: "#5b6475", dash, label: `${label} ${g(c[key], 3)} T/s${suffix(page)}` });
      }
    }
    section.append(legend([...new Set(points.map((p) => p.kernel))].sort()));
    section.append(logChart({ id: "chart-roofline", xLabel: "arithmetic intensity, FLOP/B", yLabel: "TFLOP/s (log)", points, lines }));
    if (!any) section.append(el("p", { className: "about", text: "No ceilings in these records: they are measured on a GPU at start-up (not on the CPU, nor with --no-ceilings)." }));
    return section;
  }

  // Error by layer x step, a grid per record and kernel: where a quantized kernel loses accuracy.
  function layersView() {
    const section = el("section", { id: "view-layers" }, [el("h2", { text: "Error by layer and step" }),
      el("p", { className: "about", text: "For calls that carry a layer and a step (captures of a model record both): " +
        "each cell is the worst rel_l2 of that layer at that step, from blue (the record's least) to dark red (its " +
        "worst), on a log scale." })]);
    let drawn = 0;
    const cards = el("div", { className: "cards" });
    pages.forEach((page) => {
      const rows = page.rows.filter((r) => Number.isInteger(r.layer) && Number.isInteger(r.step) && isNumber(r.rel_l2));
      const kernels = [...new Set(rows.map((r) => r.kernel))].sort();
      const all = rows.map((r) => r.rel_l2).filter((v) => v > 0);
      if (!all.length) return;
      const lo = Math.log10(minOf(all)), hi = Math.log10(maxOf(all));
      for (const kernel of kernels) {
        const worst = new Map();
        for (const r of rows.filter((row) => row.kernel === kernel)) {
          const key = `${r.layer},${r.step}`;
          worst.set(key, Math.max(worst.get(key) || 0, r.rel_l2));
        }
        const layers = [...new Set(rows.map((r) => r.layer))].sort((a, b) => a - b);
        const steps = [...new Set(rows.map((r) => r.step))].sort((a, b) => a - b);
        const cell = Math.max(8, Math.min(28, Math.floor(560 / Math.max(steps.length, layers.length)))), left = 56, top = 10;
        const W = left + steps.length * cell + 16, H = top + layers.length * cell + 36;
        const chart = svg("svg", { class: "chart heatmap", viewBox: `0 0 ${W} ${H}`, width: W, height: H });
        let marks = 0;
        layers.forEach((layer, li) => {
          chart.append(svg("text", { x: left - 4, y: top + li * cell + cell / 2 + 4, "text-anchor": "end" }, `layer ${layer}`));
          steps.forEach((step, si) => {
            const value = worst.get(`${layer},${step}`);
            if (value === undefined) return;
            const t = hi > lo && value > 0 ? (Math.log10(value) - lo) / (hi - lo) : 0.5;
            const rect = svg("rect", { x: left + si * cell, y: top + li * cell, width: cell - 1, height: cell - 1, class: "mark",
                                       fill: `hsl(${220 - 220 * t}, 70%, ${88 - 50 * t}%)` });
            rect.append(svg("title", {}, `${kernel}: layer ${layer}, step ${step}: rel_l2 ${g(value)}`));
            chart.append(rect);
            ++marks;
          });
        });
        chart.append(svg("text", { x: left, y: H - 8 }, `steps ${steps[0]}..${steps[steps.length - 1]}`));
        chart.dataset.marks = String(marks);
        drawn += marks;
        cards.append(el("div", { className: "card" }, [el("h3", { text: kernel }),
          el("div", { className: "meta", text: `${page.name}: rel_l2 ${g(Math.pow(10, lo))} (light) to ${g(Math.pow(10, hi))} (dark)` }), chart]));
      }
    });
    if (!drawn) section.append(emptyNote("No call carries both a layer and a step (generated calls and test lists have neither)."));
    else section.append(cards);
    return section;
  }

  function callsView() {
    const section = el("section", { id: "view-calls" }, [el("h2", { text: "Every call and kernel" }),
      el("p", { className: "about", text: "Click a column to sort. \"call ms\" is the whole call as users make it (with " +
        "the input preparation, where the kernel has one); \"kernel ms\" the kernel alone. Each row's command reruns it. " +
        "Errors are over the rows that see a key: a row whose keys are all masked has no defined output." })]);
    const rows = pages.flatMap((page) => page.rows.map((r) => Object.assign({ file: page.name }, r)));
    const columns = [
      { label: "call", value: (r) => r.call },
      { label: "shape", value: (r) => r.shape },
      { label: "dtype", value: (r) => r.dtype },
      { label: "kernel", value: (r) => r.kernel + (r.emulation ? " (emul.)" : "") },
      { label: "status", value: (r) => r.status, bad: (r) => r.status === "failed" || r.status === "incorrect" },
      { label: "call ms", value: (r) => r.call_s, cell: (r) => ms(r.call_s), numeric: true },
      { label: "kernel ms", value: (r) => r.kernel_s, cell: (r) => ms(r.kernel_s), numeric: true },
      { label: "TFLOP/s", value: (r) => r.tflops, cell: (r) => g(r.tflops), numeric: true },
      { label: "GB/s", value: (r) => r.gbytes_per_s, cell: (r) => g(r.gbytes_per_s), numeric: true },
      { label: "rel_l2", value: (r) => r.rel_l2, cell: (r) => g(r.rel_l2), numeric: true },
      { label: "cosine", value: (r) => r.cosine, cell: (r) => cosineText(r.cosine), numeric: true },
      { label: "max_abs", value: (r) => r.max_abs, cell: (r) => g(r.max_abs), numeric: true },
      ...(rows.some((r) => isNumber(r.rel_l2_every_row)) ? [{ label: "rel_l2 with undefined rows",
        value: (r) => r.rel_l2_every_row, cell: (r) => g(r.rel_l2_every_row), numeric: true }] : []),
      { label: "reason or rerun", value: (r) => r.reason || r.rerun,
        cell: (r) => (r.reason ? r.reason : el("code", { text: r.rerun })) },
    ];
    if (pages.length > 1) columns.unshift({ label: "record", value: (r) => r.file });
    const table = sortableTable(columns, rows, "calls-table");
    // The refusals are in the summary; here they are shown on demand.
    const filter = el("input", { type: "search", placeholder: "filter rows: kernel, status, shape..." });
    const refusals = el("input", { type: "checkbox", id: "show-refusals" });
    const apply = () => {
      const words = filter.value.toLowerCase().split(/\s+/).filter(Boolean);
      for (const tr of table.tBodies[0].rows) {
        const text = tr.textContent.toLowerCase();
        tr.hidden = !words.every((w) => text.includes(w)) || (!refusals.checked && text.includes("not_supported"));
      }
    };
    filter.addEventListener("input", apply);
    refusals.addEventListener("change", apply);
    table.addEventListener("sorted", apply);
    section.append(el("div", { className: "filter" }, [filter, " ", refusals,
      el("label", { for: "show-refusals", text: " show the calls each kernel refused (not_supported)" })]), table);
    apply();
    return section;
  }

  function environmentView() {
    const section = el("section", { id: "view-environment" }, [el("h2", { text: "Environment" })]);
    const keys = [...new Set(pages.flatMap((p) => Object.keys(p.environment)))].sort();
    const rows = [["attnreplay", (p) => p.tool_version], ["started (UTC)", (p) => p.started_utc],
                  ["stopping rule", (p) => p.stopping_rule], ["command", (p) => p.command]]
      .concat(keys.map((k) => [k, (p) => p.environment[k]]));
    const header = el("tr", {}, [el("th", { text: "" })].concat(pages.map((p) => el("th", { text: p.name }))));
    const body = rows.map(([label, value]) => el("tr", {}, [el("th", { text: label })].concat(pages.map((p) => {
      const td = el("td");
      td.append(el("code", { text: value(p) === undefined ? "-" : String(value(p)) }));
      return td;
    }))));
    section.append(el("table", { id: "environment-table" }, [el("thead", {}, [header]), el("tbody", {}, body)]));
    return section;
  }

  // ---- the page ----
  function build() {
    const root = document.getElementById("report");
    root.replaceChildren();
    const views = [["summary", "Summary", summaryView], ["speed-accuracy", "Speed vs accuracy", speedAccuracyView],
                   ["roofline", "Roofline", rooflineView], ["layers", "Layers x steps", layersView],
                   ["calls", "Calls", callsView], ["environment", "Environment", environmentView]];
    const nav = el("nav");
    const sections = views.map(([id, label, view]) => {
      nav.append(el("a", { href: "#" + id, text: label, "data-view": id }));
      return view();
    });
    root.append(el("header", {}, [el("h1", { text: "attnreplay report" }),
      el("div", { className: "files", text: pages.map((p) => `${p.name} (${p.rows.length} results)`).join(" \u00b7 ") })]),
      nav, el("div", { id: "report-errors" }), ...sections);
    // One view at a time, picked by the address's #fragment (a view can be linked, or screenshot);
    // the sections' ids differ from the fragments, so that the browser does not scroll past the header.
    const show = () => {
      const wanted = views.some(([id]) => "#" + id === location.hash) ? location.hash.slice(1) : "summary";
      for (const s of sections) s.hidden = s.id !== "view-" + wanted;
      for (const a of nav.children) a.className = a.dataset.view === wanted ? "current" : "";
    };
    window.addEventListener("hashchange", show);
    show();
    markLabelOverlaps();
  }

  // On each chart shown, how many pairs of its line labels overlap as laid out (data-label-overlaps),
  // with how many labels it has: what the browser test reads of the layout.
  function markLabelOverlaps() {
    for (const chart of document.querySelectorAll("svg.chart")) {
      const boxes = [...chart.querySelectorAll("text.line-label")].map((t) => t.getBBox());
      if (!boxes.length || boxes.every((b) => b.width === 0)) continue;  // a hidden view: nothing laid out
      let overlaps = 0;
      boxes.forEach((a, i) => boxes.slice(i + 1).forEach((b) => {
        overlaps += a.x < b.x + b.width && b.x < a.x + a.width && a.y < b.y + b.height && b.y < a.y + a.height;
      }));
      chart.dataset.labels = String(boxes.length);
      chart.dataset.labelOverlaps = String(overlaps);
    }
  }

  try {
    build();
  } catch (error) {
    fail(error && error.stack ? error.stack : error);
  }
  if (!errors.length) document.documentElement.dataset.rendered = "ok";
})();
