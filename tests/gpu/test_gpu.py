"""GPU checks, run by bench/gpu.sh on the GPU machine (not by CI, which has no GPU).

- the GPU fp64 reference agrees with the CPU fp64 reference, with windows, softcap, ALiBi and sinks
  too;
- every torch CUDA backend runs or declines with a reason, and bf16 errors land where expected;
- capture on the GPU: outputs bit-identical with it on, the captured tensors are what the op saw
  (even when the model writes to them in place right after), and the backend op is named;
- --timing graph and --timing cupti agree with CUDA events on a long kernel, and a kernel that
  cannot be captured says so.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("ATTNREPLAY_BIN", str(ROOT / "build/replay/attnreplay"))
ATTNCAP = os.environ.get("ATTNREPLAY_ATTNCAP_LIB", str(ROOT / "build/capture/libattncap.so"))
sys.path.insert(0, str(ROOT / "formats/python"))
from attnreplay_h5 import read_calls  # noqa: E402

FAST = ["--min-samples", "3", "--min-time", "0", "--timeout", "1", "--no-ceilings"]

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def replay(tmp_path, *args):
    out = tmp_path / "r.json"
    result = subprocess.run([BIN, "run", *map(str, args), "--json", str(out), "-q", *FAST],
                            capture_output=True, text=True)
    assert out.exists(), result.stdout + result.stderr
    return json.loads(out.read_text()), result


@pytest.mark.parametrize("flags", [
    ["--shape", "2,4,33,16"],
    ["--shape", "1,8,40,32", "--num_kv_heads", "2", "--causal"],
    ["--shape", "1,2,17,32", "--s_kv", "45", "--causal", "--causal_alignment", "bottom_right", "--head_dim_vo", "16"],
    ["--shape", "1,2,45,32", "--s_kv", "17", "--causal", "--causal_alignment", "bottom_right"],
    ["--shape", "1,4,300,64", "--dtype", "fp32"],
    ["--shape", "1,3,333,128", "--causal"],
    # The fused path's edges: head dims short of its 64- or 128-wide tiles (80 and 48; 7), GQA with
    # whole key tiles, key lengths that end inside a tile.
    ["--shape", "2,6,200,80", "--num_kv_heads", "3", "--head_dim_vo", "48", "--causal"],
    ["--shape", "1,2,130,7", "--s_kv", "300"],
    ["--shape", "1,8,256,128", "--num_kv_heads", "2"],
])
def test_gpu_reference_matches_cpu_reference(tmp_path, flags):
    report, _ = replay(tmp_path, *flags, "--reference", "cpu", "--kernels", "reference-cuda")
    (kernel,) = report["calls"][0]["kernels"]
    assert kernel["status"] == "not_verified", kernel
    assert kernel["error"]["rel_l2"] < 1e-13 and kernel["error"]["nan_count"] == 0, kernel["error"]


# Head dims up to 128 take the fused kernel (kernels/cuda/reference_fused.cu); wider ones the chunked DGEMMs.
REFERENCE_PATHS = pytest.mark.parametrize("head_dim", [16, 160], ids=["fused", "chunked"])


def gpu_reference_error(tmp_path, call):
    """The error record of reference-cuda's output on `call` (a .pt file's dict) against the CPU reference."""
    torch.save(call, tmp_path / "call.pt")
    report, _ = replay(tmp_path, tmp_path / "call.pt", "--reference", "cpu", "--kernels", "reference-cuda")
    (kernel,) = report["calls"][0]["kernels"]
    return kernel["error"]


@REFERENCE_PATHS
def test_gpu_reference_with_masks(tmp_path, head_dim):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 20, head_dim, generator=g) for _ in range(3))
    mask = torch.rand(2, 1, 20, 20, generator=g) > 0.4
    mask[0, 0, 3] = False  # a fully masked row: output 0 in both references
    error = gpu_reference_error(tmp_path, {"q": q, "k": k, "v": v, "attn_mask": mask})
    assert error["max_abs"] < 1e-13, error


@REFERENCE_PATHS
def test_gpu_reference_with_additive_masks_over_many_tiles(tmp_path, head_dim):
    # A float mask per head, broadcast over rows (a padding mask with transformers' finfo.min, and a
    # bias), bottom-right causal, GQA, more rows and keys than one block and one key tile hold.
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 150, head_dim, generator=g)
    k, v = (torch.randn(2, 2, 230, head_dim, generator=g) for _ in range(2))
    mask = torch.randn(2, 4, 1, 230, generator=g)
    mask[1, :, :, :37] = torch.finfo(torch.float32).min  # left padding of the second sequence
    call = {"format": "attnreplay.call", "schema_version": 2, "q": q, "k": k, "v": v, "mask": mask,
            "is_causal": True, "causal_alignment": "bottom_right"}
    error = gpu_reference_error(tmp_path, call)
    assert error["rel_l2"] < 1e-13 and error["nan_count"] == 0, error


@REFERENCE_PATHS
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
def test_gpu_reference_with_window_softcap_alibi_and_sinks(tmp_path, alignment, head_dim):
    # The GPU reference against the CPU one, every extension at once, GQA and a mask with a row that
    # sees no key.
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 24, head_dim, generator=g)
    k, v = (torch.randn(2, 2, 40, head_dim, generator=g) for _ in range(2))
    mask = torch.rand(2, 1, 24, 40, generator=g) > 0.2
    mask[1, 0, 5] = False
    call = {"format": "attnreplay.call", "schema_version": 2, "q": q, "k": k, "v": v, "mask": mask,
            "is_causal": True, "causal_alignment": alignment, "window_left": 7, "window_right": 2, "softcap": 3.0,
            "alibi_slopes": torch.tensor([0.5, 0.25, 0.125, 0.0625]), "sinks": torch.tensor([0.5, -1.0, 2.0, 0.0])}
    error = gpu_reference_error(tmp_path, call)
    assert error["max_abs"] < 1e-13, error


@REFERENCE_PATHS
def test_gpu_reference_on_sampled_rows_with_a_window_and_a_mask(tmp_path, head_dim):
    # Sampled rows are scattered positions, and a block's window bounds follow them. A kernel judged
    # on the same sampled rows by each reference: the same figures, the same rows without a key.
    # (No kernel but the references computes a softcap, ALiBi or sinks, and they refuse sampled rows.)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 300, head_dim, generator=g)
    k, v = (torch.randn(1, 4, 400, head_dim, generator=g) for _ in range(2))
    mask = torch.randn(1, 4, 300, 400, generator=g)
    mask[0, 1, ::3] = float("-inf")  # rows that see no key
    call = {"format": "attnreplay.call", "schema_version": 2, "q": q, "k": k, "v": v, "mask": mask,
            "causal_alignment": "bottom_right", "window_left": 70, "window_right": 10}
    torch.save(call, tmp_path / "x.pt")
    flags = ["--kernels", "torch-math-cuda", "--ref-sample-rows", "60"]
    on_gpu, _ = replay(tmp_path, tmp_path / "x.pt", "--reference", "cuda", *flags)
    on_cpu, _ = replay(tmp_path, tmp_path / "x.pt", "--reference", "cpu", *flags)
    a, b = on_gpu["calls"][0]["kernels"][0]["error"], on_cpu["calls"][0]["kernels"][0]["error"]
    assert a["sampled"] and a["rows_compared"] == 60 and a["no_key_rows"] > 0, a
    assert_same_error_figures(a, b, rel=1e-6)


@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
def test_a_window_alone_reaches_the_torch_backends_that_take_a_mask(tmp_path, alignment):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 24, 16, generator=g)
    k, v = (torch.randn(2, 2, 40, 16, generator=g) for _ in range(2))
    window = {"q": q.half(), "k": k.half(), "v": v.half(), "is_causal": False,
              "causal_alignment": alignment, "window_left": 5, "window_right": 0, "enable_gqa": True}
    torch.save(window, tmp_path / "w.pt")
    report, _ = replay(tmp_path, tmp_path / "w.pt", "--kernels", "torch-efficient,torch-cudnn,torch-math-cuda,flash")
    rows = {k["kernel"]: k for k in report["calls"][0]["kernels"]}
    assert rows["flash"]["status"] == "not_supported" and "sliding window" in rows["flash"]["reason"]
    for name in ("torch-efficient", "torch-math-cuda"):
        assert rows[name]["status"] == "not_verified" and rows[name]["error"]["rel_l2"] < 5e-3, rows[name]
    assert rows["torch-cudnn"]["status"] in ("not_verified", "not_supported"), rows["torch-cudnn"]


CUDA_BACKENDS = ["torch-flash", "torch-efficient", "torch-cudnn", "torch-math-cuda"]


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float16])
@pytest.mark.parametrize("seq_kv", [77, 128])
def test_padding_masks_reach_the_efficient_backend_as_sdpa_gives_them(tmp_path, mask_dtype, seq_kv):
    # A decoder's padding mask (b x 1 x 1 x s_kv), unaligned when s_kv is odd: SDPA's front door
    # pads and expands it for the memory-efficient kernel, and so must replay.
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 64, generator=g).half()
    k, v = (torch.randn(2, 4, seq_kv, 64, generator=g).half() for _ in range(2))
    keep = torch.ones(2, 1, 1, seq_kv, dtype=torch.bool)
    keep[1, ..., :9] = False  # left padding of the second sequence
    mask = keep if mask_dtype == torch.bool else torch.zeros(keep.shape).masked_fill(~keep, float("-inf")).half()
    torch.save({"q": q, "k": k, "v": v, "attn_mask": mask}, tmp_path / "m.pt")
    report, _ = replay(tmp_path, tmp_path / "m.pt", "--kernels", "torch-efficient,torch-math-cuda")
    for kernel in report["calls"][0]["kernels"]:
        assert kernel["status"] == "not_verified", kernel
        assert kernel["error"]["rel_l2"] < 2e-3, kernel["error"]



@pytest.mark.parametrize("flags", [
    ["--shape", "1,8,1024,128"],
    ["--shape", "2,8,4250,64", "--causal"],
    ["--shape", "1,16,512,128", "--num_kv_heads", "4", "--causal"],
    ["--shape", "1,4,256,64", "--layout", "bshd"],
])
def test_every_cuda_backend_runs_or_says_why(tmp_path, flags):
    report, _ = replay(tmp_path, *flags, "--dtype", "bf16", "--kernels", ",".join(CUDA_BACKENDS), "--refcheck")
    for kernel in report["calls"][0]["kernels"]:
        assert kernel["status"] in ("passed", "not_supported"), kernel
        if kernel["status"] == "passed":
            assert kernel["error"]["cosine"] > 0.999 and kernel["timing"]["method"] == "cuda-event"
            assert kernel["timing"]["cache"] == "cold-l2"
        else:
            assert kernel["reason"], kernel
    assert any(k["status"] == "passed" for k in report["calls"][0]["kernels"])


JOB = r'''
import sys, torch, torch.nn.functional as F
torch.manual_seed(0)
outs, seen = [], []
q, k, v = (torch.randn(1, 8, 512, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for step in range(4):
    o = F.scaled_dot_product_attention(q, k, v, is_causal=step % 2 == 1)
    seen.append(k.clone())
    k.mul_(1.5)   # in place, right after: the capture must hold the k the op saw
    outs.append(o)
torch.cuda.synchronize()
torch.save({"outs": [o.cpu() for o in outs], "seen_k": [x.cpu() for x in seen]}, sys.argv[1])
'''


def test_capture_on_gpu(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    subprocess.run([sys.executable, job, tmp_path / "off.pt"], check=True)
    env = dict(os.environ, LD_PRELOAD=ATTNCAP, ATTNCAP_OUT=str(tmp_path / "caps"))
    run = subprocess.run([sys.executable, job, tmp_path / "on.pt"], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    off, on = torch.load(tmp_path / "off.pt"), torch.load(tmp_path / "on.pt")
    for a, b in zip(off["outs"], on["outs"]):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    (capture,) = (tmp_path / "caps").glob("*.h5")
    converted = tmp_path / "caps.pt"
    subprocess.run([BIN, "convert", capture, converted], check=True)
    calls = torch.load(converted, weights_only=True)["calls"]
    assert len(calls) == 4
    for call, out, k in zip(calls, on["outs"], on["seen_k"]):
        assert call["devices"]["q"].startswith("cuda"), call["devices"]
        assert torch.equal(call["k"].view(torch.int16), k.view(torch.int16))
        assert torch.equal(call["out"].view(torch.int16), out.view(torch.int16))
        assert call["backend"].startswith("aten::_scaled_dot_product"), call["backend"]
    print("backends seen on the GPU:", sorted({c["backend"] for c in calls}))


GRAPH_JOB = r'''
import sys, torch
import torch.nn.functional as F
torch.manual_seed(0)
q, k, v = (torch.randn(1, 4, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
eager = F.scaled_dot_product_attention(q, k, v)          # call 0, eager
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    F.scaled_dot_product_attention(q, k, v)              # call 1, warm-up on a side stream, eager
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    static_out = F.scaled_dot_product_attention(q, k, v)  # inside the graph: not recordable
replays = []
for _ in range(2):
    graph.replay()
    replays.append(static_out.clone())
torch.cuda.synchronize()
torch.save({"eager": eager.cpu(), "replays": [r.cpu() for r in replays]}, sys.argv[1])
'''


def test_capture_leaves_cuda_graphs_working_and_says_what_it_skips(tmp_path):
    # A copy made while a graph is being captured would be recorded into the graph (or break the
    # capture): calls made during graph capture are skipped, with a notice, and the graph's replays
    # give what they give without the preload.
    job = tmp_path / "graph_job.py"
    job.write_text(GRAPH_JOB)
    subprocess.run([sys.executable, job, tmp_path / "off.pt"], check=True)
    env = dict(os.environ, LD_PRELOAD=ATTNCAP, ATTNCAP_OUT=str(tmp_path / "caps"))
    run = subprocess.run([sys.executable, job, tmp_path / "on.pt"], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    off, on = torch.load(tmp_path / "off.pt"), torch.load(tmp_path / "on.pt")
    assert torch.equal(off["eager"].view(torch.int16), on["eager"].view(torch.int16))
    for a, b in zip(off["replays"], on["replays"]):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    assert "CUDA graph" in run.stderr, run.stderr
    (capture,) = (tmp_path / "caps").glob("*.h5")
    converted = tmp_path / "caps.pt"
    subprocess.run([BIN, "convert", capture, converted], check=True)
    assert len(torch.load(converted, weights_only=True)["calls"]) == 2


TIMED_SHAPE = ["--shape", "1,24,4608,128", "--dtype", "bf16", "--ref-sample-rows", "64"]
TIMED_BACKENDS = ["torch-flash", "torch-cudnn"]


def timed(tmp_path, *flags):
    report, result = replay(tmp_path, *TIMED_SHAPE, "--kernels", ",".join(TIMED_BACKENDS), *flags)
    kernels = {k["kernel"]: k for k in report["calls"][0]["kernels"]}
    for name in TIMED_BACKENDS:
        assert kernels[name]["status"] == "not_verified", (kernels[name], result.stderr)
    return kernels


def test_graph_cupti_and_queued_timing_agree_with_cuda_events(tmp_path):
    # At 1x24x4608x128 a run takes about half a millisecond, so the launch that CUDA events count
    # and CUPTI does not is well under 10 %, and the launch latency queued samples may hold is
    # under 3 %. Graph samples are hot (the runs replay back to back): they are compared with hot
    # event samples, CUPTI's and queued ones (cold by default) with cold ones.
    cold, hot = timed(tmp_path), timed(tmp_path, "--hot-l2")
    graph, cupti = timed(tmp_path, "--timing", "graph"), timed(tmp_path, "--timing", "cupti")
    queued = timed(tmp_path, "--timing", "queued")
    for name in TIMED_BACKENDS:
        assert (cold[name]["timing"]["method"], cold[name]["timing"]["cache"]) == ("cuda-event", "cold-l2")
        assert (hot[name]["timing"]["method"], hot[name]["timing"]["cache"]) == ("cuda-event", "hot-l2")
        assert (graph[name]["timing"]["method"], graph[name]["timing"]["cache"]) == ("cuda-graph", "hot-l2")
        assert (cupti[name]["timing"]["method"], cupti[name]["timing"]["cache"]) == ("cupti", "cold-l2")
        assert (queued[name]["timing"]["method"], queued[name]["timing"]["cache"]) == ("cuda-event-queued", "cold-l2")
        assert graph[name]["timing"]["runs_per_sample"] >= 1
        # Every method reads the driver's clock and power while it samples: real figures, the clock
        # under the rated one (cudaDevAttrClockRate, the most it boosts to).
        environment = json.loads((tmp_path / "r.json").read_text())["environment"]
        assert environment["gpu_clock_monitor"] == "nvml", environment
        rated = float(environment["gpu_sm_clock_rated_mhz"])
        for method in (cold, hot, graph, cupti, queued):
            t = method[name]["timing"]
            assert 0.2 * rated < t["sm_clock_min_mhz"] <= t["sm_clock_median_mhz"] <= t["sm_clock_max_mhz"], t
            assert t["sm_clock_max_mhz"] <= rated, (t, rated)
            assert 50 < t["power_median_w"] < 2000 and 0 <= t["power_capped_fraction"] <= 1, t
        assert "--timing graph" in graph[name]["rerun"] and "--timing cupti" in cupti[name]["rerun"]
        assert "--timing queued" in queued[name]["rerun"]
        assert "--timing" not in cold[name]["rerun"]
        # A graph also removes the gaps between the kernels one call launches: torch-cudnn's graph
        # samples were 10.2 % under its hot event samples once (H100, 2026-11-22), hence 15 % there.
        for method, reference, bound in ((graph, hot, 0.15), (cupti, cold, 0.10), (queued, cold, 0.03)):
            measured, expected = method[name]["timing"]["median_s"], reference[name]["timing"]["median_s"]
            assert abs(measured / expected - 1) < bound, (name, method[name]["timing"], reference[name]["timing"])
        # The graph replays the outputs it captured: they must still be right.
        assert graph[name]["error"]["cosine"] > 0.999, graph[name]["error"]


def test_graph_timing_says_which_kernels_cannot_be_captured(tmp_path):
    # The GPU reference synchronizes inside run() and launches outside torch's current stream
    # convention: its row fails with the reason; the torch kernel beside it is timed.
    report, result = replay(tmp_path, "--shape", "1,4,256,64", "--kernels", "reference-cuda,torch-flash",
                            "--timing", "graph")
    assert result.returncode == 1, result.stdout + result.stderr  # a failed row, not a crash
    kernels = {k["kernel"]: k for k in report["calls"][0]["kernels"]}
    assert kernels["reference-cuda"]["status"] == "failed"
    assert "not capturable in a CUDA graph" in kernels["reference-cuda"]["reason"], kernels["reference-cuda"]
    assert kernels["torch-flash"]["timing"]["method"] == "cuda-graph", kernels["torch-flash"]


# The attnreplay kernel that runs each torch CUDA backend op a model's SDPA call can have gone to.
KERNEL_OF_CUDA_BACKEND = {
    "aten::_scaled_dot_product_cudnn_attention": "torch-cudnn",
    "aten::_scaled_dot_product_efficient_attention": "torch-efficient",
    "aten::_scaled_dot_product_flash_attention": "torch-flash",
    "aten::_scaled_dot_product_attention_math": "torch-math-cuda",
}


def test_decoder_in_bf16_on_cuda_every_masked_call_replays_through_efficient_and_cudnn(tmp_path):
    """tests/e2e/jobs/decoder_job.py on the GPU in bf16 (GQA, a left-padded batch, generate()):
    captured unchanged; every call, masked or not, replayed by torch-efficient and torch-cudnn
    within bf16's error on the rows that see a key; and the backend each call ran gives the model's
    own output bit for bit on every row, the pads that see no key included."""
    job = ROOT / "tests/e2e/jobs/decoder_job.py"
    args = [sys.executable, str(job), "--device", "cuda", "--dtype", "bfloat16"]
    subprocess.run([*args, "--save", str(tmp_path / "plain.npz")], check=True, capture_output=True)
    env = dict(os.environ, LD_PRELOAD=ATTNCAP, ATTNCAP_OUT=str(tmp_path / "caps"))
    captured = subprocess.run([*args, "--save", str(tmp_path / "captured.npz")], env=env, capture_output=True, text=True)
    assert captured.returncode == 0, captured.stderr
    import numpy as np
    plain, with_capture = np.load(tmp_path / "plain.npz"), np.load(tmp_path / "captured.npz")
    assert all(np.array_equal(plain[k], with_capture[k]) for k in plain.files)
    (capture,) = (tmp_path / "caps").glob("*.h5")
    captured = read_calls(capture, as_torch=True)
    backends = {c["call_index"]: c["backend"] for c in captured}
    ran = sorted({KERNEL_OF_CUDA_BACKEND[b] for b in backends.values()} | {"torch-efficient", "torch-cudnn"})
    outs = tmp_path / "outs"
    report, _ = replay(tmp_path, capture, "--kernels", ",".join(ran), "--save-outputs", outs)
    assert len(report["calls"]) == 10
    masked = [c for c in report["calls"] if c["mask"] != "none"]
    assert masked, [c["mask"] for c in report["calls"]]
    padded = 0
    model_outputs = {c["call_index"]: c["out"] for c in captured}
    for call in report["calls"]:
        for kernel in call["kernels"]:
            assert kernel["status"] == "not_verified", (call["call_index"], kernel["kernel"], kernel["reason"])
            error = kernel["error"]  # over the rows that see a key
            assert error["rel_l2"] < 2e-2 and error["nan_count"] == 0, (call["call_index"], kernel["kernel"], error)
        padded += "no_key_rows" in call["kernels"][0]["error"]
        own = KERNEL_OF_CUDA_BACKEND[backends[call["call_index"]]]
        replayed = torch.load(outs / f"call{call['call_index']}_{own}.pt", weights_only=True)["out"]
        model = model_outputs[call["call_index"]]
        assert torch.equal(replayed.view(torch.int16), model.view(torch.int16)), (
            call["call_index"], own, (replayed.float() - model.float()).abs().amax(dim=-1))
    assert padded == 4, "the padded prompt's two passes (logits and prefill), two layers each"


def test_error_statistics_are_the_same_compared_on_the_gpu_and_on_the_cpu(tmp_path):
    """With the GPU reference, outputs are compared on the GPU (replay/judge/error_stats.h); with the CPU
    one, on the CPU: the same figures to fp64 rounding, no-key rows included."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 64, 32, generator=g).bfloat16() for _ in range(3))
    mask = torch.rand(2, 1, 64, 64, generator=g) > 0.3
    mask[1, 0, :5] = False  # rows that see no key
    torch.save({"q": q, "k": k, "v": v, "attn_mask": mask}, tmp_path / "m.pt")
    on_gpu, _ = replay(tmp_path, tmp_path / "m.pt", "--reference", "cuda", "--kernels", "torch-math")
    on_cpu, _ = replay(tmp_path, tmp_path / "m.pt", "--reference", "cpu", "--kernels", "torch-math")
    a, b = on_gpu["calls"][0]["kernels"][0]["error"], on_cpu["calls"][0]["kernels"][0]["error"]
    assert a["no_key_rows"] == b["no_key_rows"] == 5 * 4
    assert_same_error_figures(a, b)


def assert_same_error_figures(a, b, rel=1e-9):
    """Every figure of two error records equal to `rel`, those over every row too; counts and places
    exactly."""
    for field in ("elements", "sampled", "rows_compared", "nan_count", "inf_count", "beyond_tolerance", "worst",
                  "no_key_rows"):
        assert a.get(field) == b.get(field), (field, a.get(field), b.get(field))
    close = lambda x, y: (x is None and y is None) or abs(x - y) <= rel * abs(y) + 1e-15
    for field in ("max_abs", "mean_abs", "mse", "rmse", "std_abs", "rel_l1", "rel_l2", "cosine", "max_rel"):
        assert close(a[field], b[field]), (field, a[field], b[field])
    for side in ("output", "reference"):
        for moment in ("min", "max", "mean", "std"):
            assert close(a[side][moment], b[side][moment]), (side, moment, a[side], b[side])
    whole = "including_rows_without_a_key"
    assert (a.get(whole) is None) == (b.get(whole) is None)
    if b.get(whole):
        assert_same_error_figures(dict(a[whole], sampled=a["sampled"], rows_compared=a["rows_compared"]),
                                  dict(b[whole], sampled=b["sampled"], rows_compared=b["rows_compared"]), rel)


def numpy_figures(o, ref, counted):
    """The figures over the elements `counted` marks where the output is finite (docs/metrics.md)."""
    finite = np.isfinite(o) & counted
    of, rf = o[finite], ref[finite]
    e = np.abs(of - rf)
    error = np.where(finite, np.abs(np.where(finite, o, 0) - ref), -1.0)
    flat = int(np.argmax(error))  # the first largest
    b, h, s, d = np.unravel_index(flat, o.shape)
    relative = e / (np.abs(rf) + 1e-8)
    moments = lambda x: {"min": x.min(), "max": x.max(), "mean": x.mean(), "std": x.std()}
    return {
        "elements": int(finite.sum()), "nan_count": int((np.isnan(o) & counted).sum()),
        "inf_count": int((np.isinf(o) & counted).sum()),
        "worst": {"batch": int(b), "head": int(h), "row": int(s), "channel": int(d)},
        "max_abs": e.max(), "mean_abs": e.mean(), "mse": (e * e).mean(), "rmse": np.sqrt((e * e).mean()),
        "std_abs": e.std(), "rel_l1": e.sum() / np.abs(rf).sum(), "rel_l2": np.sqrt((e * e).sum() / (rf * rf).sum()),
        "cosine": (of * rf).sum() / np.sqrt((of * of).sum() * (rf * rf).sum()), "max_rel": relative.max(),
        "beyond_tolerance": int(((e > 1e-2) & (relative > 1e-2)).sum()),
        "output": moments(of), "reference": moments(rf),
    }


def numpy_error_figures(out, ref, no_key):
    """The error record's figures from an output and the reference, in numpy: over the rows that see a
    key (no_key: (b, h, s) bools), and over every row beside them."""
    o = out.astype(np.float64)
    figures = numpy_figures(o, ref, np.broadcast_to(~no_key[..., None], o.shape))
    if no_key.any():
        figures["including_rows_without_a_key"] = numpy_figures(o, ref, np.ones(o.shape, dtype=bool))
    return figures


def assert_figures_match(got, want, rel=1e-9):
    """Counts and places exactly; every other figure to `rel` (summation order)."""
    for field, value in want.items():
        if isinstance(value, dict) and field not in ("worst",):
            assert_figures_match(got[field], value, rel)
        elif isinstance(value, (int, dict)):
            assert got[field] == value, (field, got[field], value)
        else:
            assert abs(got[field] - value) <= rel * abs(value) + 1e-300, (field, got[field], value)


def large_masked_call(path, dtype, seed=7):
    """2 x 4 x 2048 x 64: hundreds of blocks of the one-pass comparison; batch 1's first 40 rows see no
    key, batch 0's rows see every other key."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 4, 2048, 64, generator=g).to(dtype) for _ in range(3))
    mask = torch.ones(2, 1, 2048, 2048, dtype=torch.bool)
    mask[1, 0, :40] = False
    mask[0, 0, :, 1::2] = False
    torch.save({"q": q, "k": k, "v": v, "attn_mask": mask}, path)
    no_key = np.zeros((2, 4, 2048), dtype=bool)
    no_key[1, :, :40] = True
    return no_key


NONFINITE_KERNEL = ["--kernel-module", ROOT / "tests/gpu/plugins/nonfinite_outputs.py"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_one_pass_comparison_on_the_gpu_gives_numpys_figures(tmp_path, dtype):
    """The GPU's one-pass comparison (replay/judge/cuda/error_sums.cu) against numpy's over the saved
    output and the GPU reference (reference-cuda's output, the same computation bit for bit): outputs
    with NaN and Inf, rows that see no key, each output dtype it reads; every figure, count and place."""
    no_key = large_masked_call(tmp_path / "c.pt", dtype)
    judged = ["sdpa-nonfinite"] + (["torch-efficient"] if dtype != torch.float64 else [])
    record, _ = replay(tmp_path, tmp_path / "c.pt", "--reference", "cuda", *NONFINITE_KERNEL, "--kernels",
                       ",".join(judged + ["reference-cuda"]), "--save-outputs", tmp_path / "outs")
    rows = {row["kernel"]: row for row in record["calls"][0]["kernels"]}
    saved = lambda name: torch.load(tmp_path / "outs" / f"call0_{name}.pt", weights_only=True)["out"].double().numpy()
    reference = saved("reference-cuda")
    assert rows["reference-cuda"]["error"]["max_abs"] == 0.0, "the reference kernel is the reference, bit for bit"
    assert rows["sdpa-nonfinite"].get("error"), rows["sdpa-nonfinite"]
    for name in judged:
        got = rows[name].get("error")
        assert got, (name, rows[name]["status"], rows[name]["reason"])
        assert_figures_match(got, numpy_error_figures(saved(name), reference, no_key))
        assert got["no_key_rows"] == 40 * 4
    nonfinite = rows["sdpa-nonfinite"]["error"]
    assert nonfinite["nan_count"] > 0 and nonfinite["inf_count"] > 0 and nonfinite["max_abs"] >= 0.2, nonfinite


def test_one_pass_comparison_on_sampled_rows_agrees_with_the_cpus(tmp_path):
    """On sampled rows the GPU compares index-selected outputs in one pass; the CPU's comparison of the
    same rows (its own fp64 reference) agrees to the references' difference."""
    large_masked_call(tmp_path / "c.pt", torch.bfloat16)
    flags = [*NONFINITE_KERNEL, "--kernels", "sdpa-nonfinite,torch-efficient", "--ref-sample-rows", "300"]
    on_gpu, _ = replay(tmp_path, tmp_path / "c.pt", "--reference", "cuda", *flags)
    on_cpu, _ = replay(tmp_path, tmp_path / "c.pt", "--reference", "cpu", *flags)
    for a, b in zip(on_gpu["calls"][0]["kernels"], on_cpu["calls"][0]["kernels"]):
        assert a["kernel"] == b["kernel"] and a["error"]["sampled"] and a["error"]["rows_compared"] == 300
        assert_same_error_figures(a["error"], b["error"], rel=1e-6)


ROUTINES = {
    "decode": ["--routine", "BatchDecodeWithPagedKVCacheWrapper", "--page_size", "16", "--batch_size", "16",
               "--s_qo", "1", "--s_kv", "2048", "--num_qo_heads", "32", "--num_kv_heads", "8"],
    "paged_prefill": ["--routine", "BatchPrefillWithPagedKVCacheWrapper", "--page_size", "16", "--batch_size", "6",
                      "--s_qo", "512", "--s_kv", "1024", "--num_qo_heads", "16", "--num_kv_heads", "4", "--causal"],
    "ragged_prefill": ["--routine", "BatchPrefillWithRaggedKVCacheWrapper", "--batch_size", "6", "--s_qo", "512",
                       "--s_kv", "512", "--num_qo_heads", "16", "--num_kv_heads", "16", "--causal"],
}


@pytest.mark.parametrize("routine", sorted(ROUTINES))
def test_flashinfer_style_batches_replay_through_every_kernel_that_takes_them(tmp_path, routine):
    # torch-flash-varlen runs the batch in one launch; torch's SDPA backends and the GPU reference
    # one sequence at a time; each against the GPU fp64 reference of every sequence.
    flags = [*ROUTINES[routine], "--head_dim_qk", "128", "--dtype", "bf16", "--random_actual_seq_len", "--seed", "3"]
    kernels = "torch-flash-varlen,torch-flash,torch-efficient,torch-cudnn,torch-math-cuda,reference-cuda"
    report, result = replay(tmp_path, *flags, "--kernels", kernels, "--refcheck")
    call = report["calls"][0]
    assert call["layout"] == "thd" and len(call["sequences"]["k_lens"]) == int(flags[flags.index("--batch_size") + 1])
    by_name = {k["kernel"]: k for k in call["kernels"]}
    assert by_name["torch-flash-varlen"]["status"] == "passed", by_name["torch-flash-varlen"]
    assert by_name["torch-flash-varlen"]["error"]["rel_l2"] < 1e-2, by_name["torch-flash-varlen"]["error"]
    for name, kernel in by_name.items():
        assert kernel["status"] in ("passed", "not_supported"), (name, kernel)
        if kernel["status"] == "not_supported":
            assert kernel["reason"], (name, kernel)
    ran = [name for name, k in by_name.items() if k["status"] == "passed"]
    assert len(ran) >= 4, (ran, by_name)
    print(routine, call["batching"], {n: (k.get("timing") or {}).get("median_s") for n, k in by_name.items()})


def test_python_entry_points_are_captured_on_cuda(tmp_path):
    # FlashInfer's wrappers and flash_attn_with_kvcache, as the stand-ins of tests/e2e/stand_ins give
    # them (the real libraries are not on this machine), with every tensor and page list on the GPU:
    # capture's Python side hands each call over, and its pages are mapped on the device.
    job = ROOT / "tests/e2e/jobs/python_entry_points_job.py"
    subprocess.run([sys.executable, job, "--device", "cuda", "--save", tmp_path / "off.npz"], check=True)
    env = dict(os.environ, LD_PRELOAD=ATTNCAP, ATTNCAP_OUT=str(tmp_path / "caps"))
    run = subprocess.run([sys.executable, job, "--device", "cuda", "--save", tmp_path / "on.npz"], env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "not observed" not in run.stderr and "not captured" not in run.stderr, run.stderr
    import numpy as np
    off, on = np.load(tmp_path / "off.npz"), np.load(tmp_path / "on.npz")
    assert all(np.array_equal(off[name], on[name]) for name in off.files)
    (capture,) = (tmp_path / "caps").glob("*.h5")
    calls = read_calls(str(capture))
    assert len(calls) == len(off.files) and all(c["layout"] == "thd" for c in calls)
    assert calls[0]["op"] == "flashinfer::BatchDecodeWithPagedKVCacheWrapper.run"
    report, _ = replay(tmp_path, capture, "--kernels", "reference-cuda")
    for name, call in zip(off.files[:-1], report["calls"]):
        by_name = {k["kernel"]: k for k in call["kernels"]}
        assert by_name["model-output"]["error"]["rel_l2"] < 2.0 ** -11, (name, by_name["model-output"])
    assert all(k["status"] == "not_supported" for k in report["calls"][-1]["kernels"])
