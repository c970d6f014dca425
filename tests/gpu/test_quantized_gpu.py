"""GPU checks of attnreplay's own CUDA kernels (flash, sage1-int8, sage2-int8-fp8, fa3-fp8), run by
bench/gpu.sh on the GPU machine: each against its CPU emulation (`<kernel>-cpu`) on the same
inputs, which follows the same definition (docs/quantized.md) step by step.

- their errors against the fp64 reference agree, and neither has a NaN;
- their outputs are close: the definition leaves open only the order of fp32 sums and exp2's last
  bits, which move an INT8 code, an FP8 value or an output's last bit now and then;
- every option (--quant_gran, --no_k_smooth, --pv_accum_dtype, --fp8_scale) reaches the kernel;
- calls the kernels cannot run are declined with a reason.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("ATTNREPLAY_BIN", str(ROOT / "build/replay/attnreplay"))
FAST = ["--min-samples", "3", "--min-time", "0", "--timeout", "1", "--no-ceilings"]
KERNELS = ["flash", "sage1-int8", "sage2-int8-fp8", "fa3-fp8"]
# rel_l2 of (CUDA output - emulation output) against the emulation's norm. With the mma.sync
# kernels of 2026-11-22 the largest seen on an H100 was 2.2e-4 for bf16 and 4.8e-5 for fp16.
OUTPUT_TOLERANCE = {"bfloat16": 1e-3, "float16": 2.5e-4}
# sage2's fp32+fp16: the H100 runs the k32 e4m3 MMA with fp16 accumulation as two k16 halves, each
# rounded to fp16, where the emulation rounds the 32-key chunk once; 9.5e-4 was seen (bf16).
FP16_ACCUMULATION_TOLERANCE = 4e-3
# Kinds with e4m3 MMAs: on the H100 they differ more (the same code with bf16 or INT8 MMAs stays
# within the bounds above), most likely because the FP8 warpgroup MMA keeps fewer accumulator bits
# than the emulation's fp32 (docs/quantized.md). Largest seen: 4.7e-3 (fa3-fp8, whose Q·Kᵀ feeds
# exp2), 1.4e-3 (sage2-int8-fp8); errors against the reference still agree to 5 % (checked first).
FP8_MMA_TOLERANCE = 7.5e-3
FP8_MMA_KERNELS = {"sage2-int8-fp8", "fa3-fp8"}

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def replay(tmp_path, *args):
    out = tmp_path / "r.json"
    result = subprocess.run([BIN, "run", *map(str, args), "--json", str(out), "--save-outputs", str(tmp_path / "outs"),
                             "-q", *FAST], capture_output=True, text=True)
    assert out.exists(), result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert len(report["calls"]) == 1, report
    return {k["kernel"]: k for k in report["calls"][0]["kernels"]}, result


def saved_output(tmp_path, kernel):
    return torch.load(tmp_path / "outs" / f"call0_{kernel}.pt", weights_only=True)["out"]


def check_against_emulation(tmp_path, kernel, *flags, tolerance=None):
    emulation = f"{kernel}-cpu"
    rows, result = replay(tmp_path, *flags, "--kernels", f"{kernel},{emulation}")
    for name in (kernel, emulation):
        assert rows[name]["status"] == "not_verified", (rows[name], result.stderr)
        assert rows[name]["error"]["nan_count"] == 0, rows[name]["error"]
    gpu, cpu = rows[kernel]["error"]["rel_l2"], rows[emulation]["error"]["rel_l2"]
    assert abs(gpu - cpu) <= 0.05 * max(gpu, cpu) + 1e-7, (kernel, gpu, cpu)
    a, b = saved_output(tmp_path, kernel), saved_output(tmp_path, emulation)
    assert a.shape == b.shape and a.dtype == b.dtype
    assert not a.isnan().any()
    difference = ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()
    print(f"{kernel} {' '.join(map(str, flags))}: rel_l2 {gpu:.3e} (emulation {cpu:.3e}), "
          f"outputs differ by {difference:.2e}")
    if tolerance is None:
        tolerance = OUTPUT_TOLERANCE[str(b.dtype).removeprefix("torch.")]
    if kernel in FP8_MMA_KERNELS:
        tolerance = max(tolerance, FP8_MMA_TOLERANCE)
    assert difference < tolerance, (kernel, difference)
    return rows


SHAPES = {
    "seq4250-d64": ["--shape", "1,2,4250,64"],
    "seq4250-d128-fp16-causal": ["--shape", "1,2,4250,128", "--dtype", "fp16", "--causal"],
    "seq300-d128-batch2": ["--shape", "2,4,300,128"],
    "seq300-d64-gqa-causal": ["--shape", "1,4,300,64", "--num_kv_heads", "2", "--causal"],
    "seq1-d64": ["--shape", "1,2,1,64"],
    "seq1-kv300-d128": ["--shape", "1,2,1,128", "--s_kv", "300"],
    # More keys than queries, bottom-right (flash-attn's), from (b, s, h, d) inputs.
    "cross-bottom-right-bshd": ["--shape", "1,4,200,64", "--s_kv", "450", "--num_kv_heads", "1", "--causal",
                                "--causal_alignment", "bottom_right", "--layout", "bshd"],
    # More queries than keys, bottom-right: the first 250 rows see no key and must be 0.
    "rows-without-keys": ["--shape", "1,2,450,128", "--s_kv", "200", "--causal", "--causal_alignment", "bottom_right"],
    "more-queries-top-left": ["--shape", "1,2,450,64", "--s_kv", "200", "--causal", "--causal_alignment", "top_left"],
    # Heads too long for a cluster's shared memory: the FP8 codes by groups of CTAs that meet in the
    # global memory.
    "long-keys-head-groups": ["--shape", "1,2,64,128", "--s_kv", "16384"],
    # The same over batches and shared K/V heads, keys not a whole number of 64-key items.
    "long-keys-head-groups-gqa": ["--shape", "2,4,100,128", "--s_kv", "9000", "--num_kv_heads", "2"],
    # The longest heads K's groups take: 128 blocks, whose CTAs (8 heads' 1024) fill an H100 or H200
    # at six an SM, as the groups need; sage2's V is coded in the same launch.
    "longest-key-group": ["--shape", "1,8,64,128", "--s_kv", "16384"],
    # K's heads past that (396 blocks) take two passes; sage2's V and fa3-fp8's heads are still held
    # by FP8 groups, in a launch of their own.
    "long-keys-two-pass-d128": ["--shape", "1,2,64,128", "--s_kv", "50688"],
    # Heads too long for a group (over half the CTAs an H100 or H200 holds): two passes.
    "long-keys-two-pass": ["--shape", "1,2,64,64", "--s_kv", "131072"],
    # Head dims the kernels pad with zero channels, to 128 and to 64, from either layout; Q·Kᵀ's and
    # V's apart (the output keeps V's).
    "padded-d96-causal": ["--shape", "1,4,300,96", "--causal"],
    "padded-d32-gqa-bshd": ["--shape", "1,4,257,32", "--num_kv_heads", "2", "--layout", "bshd"],
    "padded-dqk128-dvo64": ["--shape", "2,2,200,128", "--head_dim_vo", "64"],
    "padded-dqk80-dvo112-decode": ["--shape", "1,4,1,80", "--head_dim_vo", "112", "--s_kv", "700"],
    # GQA's query heads packed as rows of their KV head's (kernels/quantized_attention.h): a decode
    # step from (b, s, h, d) inputs; several query rows (bhsd), 8 heads a KV head; padded head dims.
    "packed-decode-bshd": ["--shape", "3,32,1,128", "--num_kv_heads", "8", "--s_kv", "2100", "--layout", "bshd"],
    "packed-rows4-d64": ["--shape", "2,16,4,64", "--num_kv_heads", "2", "--s_kv", "777"],
    # One sequence's keys split across CTAs and combined (Attention::run): a decode step of 32 splits,
    # and 40 rows of fp16 whose last split holds a partial block.
    "split-keys-decode": ["--shape", "1,32,1,128", "--num_kv_heads", "8", "--s_kv", "32768"],
    "split-keys-rows-fp16": ["--shape", "1,4,40,64", "--s_kv", "5000", "--dtype", "fp16"],
    # A decode step's causal diagonal hides nothing bottom-right: packed, at a padded head dim.
    "padded-d96-packed-decode-causal": ["--shape", "1,8,1,96", "--num_kv_heads", "2", "--s_kv", "500", "--causal",
                                        "--causal_alignment", "bottom_right"],
}
PADDED = {flags_id for flags_id in SHAPES if flags_id.startswith("padded-")}


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("flags", SHAPES.values(), ids=SHAPES.keys())
def test_cuda_kernel_agrees_with_its_emulation(tmp_path, kernel, flags):
    rows = check_against_emulation(tmp_path, kernel, *flags)
    assert rows[kernel]["timing"]["method"] == "cuda-event"
    # Every kind but flash on (b, h, s, d) inputs of head dim 64 or 128 prepares them (layout,
    # padding, smoothing, quantization).
    padded = any(flags == SHAPES[name] for name in PADDED)
    prepares = kernel != "flash" or "bshd" in flags or padded
    assert (rows[kernel].get("timing_with_preparation") is not None) == prepares, rows[kernel]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("scale", ["-0.09", "0"], ids=["negative", "zero"])
def test_negative_and_zero_softmax_scales(tmp_path, kernel, scale):
    # The kernels scale scores inside exp2's FFMA and take m from the unscaled ones: a negative
    # scale takes the least; a zero one must still leave the causal mask's hidden keys at p = 0.
    check_against_emulation(tmp_path, kernel, "--shape", "1,2,300,64", "--causal", f"--scale={scale}")


def test_rows_without_keys_are_zero(tmp_path):
    replay(tmp_path, *SHAPES["rows-without-keys"], "--kernels", ",".join(KERNELS))
    for kernel in KERNELS:
        out = saved_output(tmp_path, kernel)
        assert out[:, :, :250].abs().max().item() == 0.0, kernel
        assert out[:, :, 250:].abs().max().item() > 0.0, kernel


@pytest.mark.parametrize("kernel", ["sage1-int8", "sage2-int8-fp8"])
@pytest.mark.parametrize("granularity", ["per_warp", "per_thread"])
def test_nans_in_queries_and_keys_code_as_zero(tmp_path, kernel, granularity):
    # The INT8 codes of a NaN are 0, as the GPU's conversion rounds one (docs/quantized.md, step 2),
    # in the preparation and in sage2's own coding of Q inside its kernel. A row of Q all NaN then
    # scores 0 against every key, and its output is V's mean; a NaN in K makes its channel's mean
    # NaN, so that channel codes 0 for every key. V stays finite: no NaN comes out. The NaN row's
    # neighbours are 100 times larger, so that its group's scale is too: codes of -1 (what adding
    # 1.5 * 2^23 to a NaN leaves in the low byte) would move its output by about 1, not 0.005.
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, 300, 128, generator=g) for _ in range(3))
    q[0, 0, 16:32] *= 100
    q[0, 0, 17] = float("nan")
    q[0, 1, 40, 5] = float("nan")
    k[0, 1, 200, 9] = float("nan")
    path = tmp_path / "nans.pt"
    torch.save({"q": q.bfloat16(), "k": k.bfloat16(), "v": v.bfloat16()}, path)
    emulation = f"{kernel}-cpu"
    replay(tmp_path, path, "--quant_gran", granularity, "--kernels", f"{kernel},{emulation}")
    a, b = saved_output(tmp_path, kernel).double(), saved_output(tmp_path, emulation).double()
    assert not a.isnan().any() and not b.isnan().any()
    values_mean = v[0, 0].bfloat16().double().mean(0)
    for out in (a, b):
        assert torch.allclose(out[0, 0, 17], values_mean, atol=0.02), (out[0, 0, 17] - values_mean).abs().max()
    difference = ((a - b).norm() / b.norm()).item()
    tolerance = FP8_MMA_TOLERANCE if kernel in FP8_MMA_KERNELS else OUTPUT_TOLERANCE["bfloat16"]
    assert difference < tolerance, difference


def biased_keys_call(path):
    # K with large per-channel means, as real models have: what smoothing is for.
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 4, 700, 128, generator=g) for _ in range(3))
    k += 4 * torch.randn(1, 4, 1, 128, generator=g)
    torch.save({"q": q.bfloat16(), "k": k.bfloat16(), "v": v.bfloat16()}, path)
    return path


@pytest.mark.parametrize("kernel", ["sage1-int8", "sage2-int8-fp8"])
@pytest.mark.parametrize("granularity", ["per_block", "per_warp", "per_thread"])
@pytest.mark.parametrize("smooth", [[], ["--no_k_smooth"]], ids=["smooth", "no-smooth"])
def test_int8_options_reach_the_kernel(tmp_path, kernel, granularity, smooth):
    call = biased_keys_call(tmp_path / "biased.pt")
    check_against_emulation(tmp_path, kernel, call, "--quant_gran", granularity, *smooth)


def test_k_smoothing_helps_with_biased_keys(tmp_path):
    call = biased_keys_call(tmp_path / "biased.pt")
    smooth, _ = replay(tmp_path, call, "--kernels", "sage1-int8")
    raw, _ = replay(tmp_path, call, "--kernels", "sage1-int8", "--no_k_smooth")
    assert smooth["sage1-int8"]["error"]["rel_l2"] < raw["sage1-int8"]["error"]["rel_l2"]


@pytest.mark.parametrize("accumulation", ["fp32", "fp32+fp32", "fp32+fp16"])
@pytest.mark.parametrize("flags", [["--shape", "1,4,700,64"], ["--shape", "1,2,1000,128", "--causal"]],
                         ids=["d64", "d128-causal"])
def test_pv_accumulation_reaches_the_kernel(tmp_path, accumulation, flags):
    tolerance = FP16_ACCUMULATION_TOLERANCE if accumulation == "fp32+fp16" else None
    check_against_emulation(tmp_path, "sage2-int8-fp8", *flags, "--pv_accum_dtype", accumulation, tolerance=tolerance)


@pytest.mark.parametrize("scale", ["per_tensor", "per_head"])
def test_fp8_scale_reaches_the_kernel(tmp_path, scale):
    # Heads of different magnitudes, so that per-tensor and per-head scales differ.
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 333, 128, generator=g) * torch.tensor([0.25, 1, 2, 4]).view(1, 4, 1, 1)
               for _ in range(3))
    torch.save({"q": q.half(), "k": k.half(), "v": v.half()}, tmp_path / "heads.pt")
    check_against_emulation(tmp_path, "fa3-fp8", tmp_path / "heads.pt", "--fp8_scale", scale)


@pytest.mark.parametrize("flags, reason", [
    (["--shape", "1,2,64,64", "--dtype", "fp32"], "bfloat16 or float16"),
    (["--shape", "1,2,64,100"], "multiples of 8 up to 128"),
    (["--shape", "1,2,64,64", "--head_dim_vo", "256"], "multiples of 8 up to 128"),
])
def test_unsupported_calls_are_declined_with_a_reason(tmp_path, flags, reason):
    rows, _ = replay(tmp_path, *flags, "--kernels", ",".join(KERNELS))
    for kernel in KERNELS:
        assert rows[kernel]["status"] == "not_supported", rows[kernel]
        assert reason in rows[kernel]["reason"], rows[kernel]


def test_masks_other_than_padding_are_declined(tmp_path):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 40, 64, generator=g).bfloat16() for _ in range(3))
    torch.save({"q": q, "k": k, "v": v, "attn_mask": torch.rand(1, 1, 40, 40, generator=g) > 0.5}, tmp_path / "m.pt")
    rows, _ = replay(tmp_path, tmp_path / "m.pt", "--kernels", ",".join(KERNELS))
    for kernel in KERNELS:
        assert rows[kernel]["status"] == "not_supported", rows[kernel]
        assert "this one is dense: query row 0 of batch 0 sees keys that are not one range" in rows[kernel]["reason"], rows[kernel]


def padded_call(path, batch, heads, kv_heads, seq_q, seq_kv, dim, pads, causal):
    """A left-padded batch as transformers gives SDPA: keys from pads[b] on, causal bottom-right."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(batch, heads, seq_q, dim, generator=g).bfloat16()
    k, v = (torch.randn(batch, kv_heads, seq_kv, dim, generator=g).bfloat16() for _ in range(2))
    keys = torch.arange(seq_kv)[None, :] >= torch.tensor(pads)[:, None]
    mask = keys[:, None, None, :].expand(batch, 1, seq_q, seq_kv).clone()
    if causal:
        mask &= torch.ones(seq_q, seq_kv, dtype=torch.bool).tril(seq_kv - seq_q)
    torch.save({"q": q, "k": k, "v": v, "attn_mask": mask, "enable_gqa": heads != kv_heads}, path)
    return path


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("case", ["prefill", "decode"])
def test_padded_batches_run_in_one_launch_as_their_emulations(tmp_path, kernel, case):
    """docs/masks.md: a padded batch's entries cut to their keys, causal at a moved diagonal, each
    prepared alone and all attended in one launch (grid z an entry); the rows that see no key 0."""
    if case == "prefill":
        call = padded_call(tmp_path / "p.pt", 3, 8, 2, 600, 600, 128, [0, 37, 300], causal=True)
    else:
        call = padded_call(tmp_path / "p.pt", 4, 8, 2, 1, 2000, 128, [0, 129, 700, 1999], causal=False)
    check_against_emulation(tmp_path, kernel, call)


BATCHES = {
    # Every sequence's own length, so that the launch's shorter sequences leave CTAs early.
    "decode-paged": ["--routine", "BatchDecodeWithPagedKVCacheWrapper", "--page_size", "16", "--batch_size", "9",
                     "--s_qo", "1", "--s_kv", "1500", "--num_qo_heads", "16", "--num_kv_heads", "4"],
    "prefill-paged-causal": ["--routine", "BatchPrefillWithPagedKVCacheWrapper", "--page_size", "16", "--batch_size",
                             "5", "--s_qo", "300", "--s_kv", "700", "--num_qo_heads", "8", "--num_kv_heads", "2",
                             "--causal"],
    "prefill-ragged-causal": ["--routine", "BatchPrefillWithRaggedKVCacheWrapper", "--batch_size", "6", "--s_qo", "400",
                              "--s_kv", "400", "--num_qo_heads", "8", "--num_kv_heads", "8", "--causal"],
}


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("flags", BATCHES.values(), ids=BATCHES.keys())
def test_ragged_and_paged_batches_run_in_one_launch_as_their_emulations(tmp_path, kernel, flags):
    """A ragged or paged batch's sequences each prepared alone (their pages gathered), all attended in
    one launch, against the emulation of the same sequences."""
    check_against_emulation(tmp_path, kernel, *flags, "--head_dim_qk", "128", "--dtype", "bf16",
                            "--random_actual_seq_len", "--seed", "4")


@pytest.mark.parametrize("timing", ["graph", "cupti"])
@pytest.mark.parametrize("flags", [["--shape", "1,8,1024,128", "--causal"],
                                   # Heads past a cluster: the preparation's groups of CTAs, whose
                                   # counters each launch must leave zeroed for the next replay.
                                   ["--shape", "1,2,256,128", "--s_kv", "9000"]], ids=["clusters", "groups"])
def test_kernels_time_under_graphs_and_cupti(tmp_path, timing, flags):
    # The kernels queue on torch's current stream, so a CUDA graph captures them; the graph's
    # replays must still leave the right output behind.
    rows, result = replay(tmp_path, *flags, "--kernels", ",".join(KERNELS), "--timing", timing)
    for kernel in KERNELS:
        assert rows[kernel]["status"] == "not_verified", (rows[kernel], result.stderr)
        assert rows[kernel]["timing"]["method"] == {"graph": "cuda-graph", "cupti": "cupti"}[timing]
        assert rows[kernel]["error"]["cosine"] > 0.99, rows[kernel]["error"]
        assert rows[kernel].get("timing_with_preparation") is not None or kernel == "flash"


CAPTURE_JOB = r'''
import torch
from diffusers import FluxTransformer2DModel
torch.manual_seed(0)
# diffusers' tiny Flux test config, with head dim 64 (what the kernels take), in bf16 on the GPU.
model = FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=2, num_single_layers=2,
                               attention_head_dim=64, num_attention_heads=2, joint_attention_dim=32,
                               pooled_projection_dim=32, axes_dims_rope=[16, 24, 24]).cuda().to(torch.bfloat16)
tokens, text = 300, 77
bf16 = dict(device="cuda", dtype=torch.bfloat16)
with torch.no_grad():
    model(hidden_states=torch.randn(1, tokens, 4, **bf16), encoder_hidden_states=torch.randn(1, text, 32, **bf16),
          pooled_projections=torch.randn(1, 32, **bf16), img_ids=torch.randn(tokens, 3, **bf16),
          txt_ids=torch.randn(text, 3, **bf16), timestep=torch.tensor([1.0], **bf16))
torch.cuda.synchronize()
'''
ATTNCAP = os.environ.get("ATTNREPLAY_ATTNCAP_LIB", str(ROOT / "build/capture/libattncap.so"))


def test_cuda_kernels_agree_with_their_emulations_on_captured_inputs(tmp_path):
    # Real model tensors (RoPE'd Q and K of a Flux transformer) rather than Gaussian ones, captured
    # on the GPU under LD_PRELOAD and replayed through every kernel and its emulation.
    pytest.importorskip("diffusers")
    job = tmp_path / "flux_job.py"
    job.write_text(CAPTURE_JOB)
    env = dict(os.environ, LD_PRELOAD=ATTNCAP, ATTNCAP_OUT=str(tmp_path / "caps"))
    run = subprocess.run([sys.executable, job], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    out = tmp_path / "r.json"
    kernels = ",".join(k for kernel in KERNELS for k in (kernel, f"{kernel}-cpu"))
    result = subprocess.run([BIN, "run", tmp_path / "caps", "--kernels", kernels, "--json", out, "-q", *FAST],
                            capture_output=True, text=True)
    assert out.exists(), result.stdout + result.stderr
    calls = json.loads(out.read_text())["calls"]
    assert len(calls) == 4, [c["shape"] for c in calls]  # 2 joint + 2 single blocks
    for call in calls:
        rows = {k["kernel"]: k for k in call["kernels"]}
        for kernel in KERNELS:
            gpu, cpu = rows[kernel], rows[f"{kernel}-cpu"]
            assert gpu["status"] == cpu["status"] == "not_verified", (call["call_index"], gpu, cpu)
            assert gpu["error"]["nan_count"] == 0
            a, b = gpu["error"]["rel_l2"], cpu["error"]["rel_l2"]
            print(f"call {call['call_index']} {kernel}: rel_l2 {a:.3e}, emulation {b:.3e}")
            assert abs(a - b) <= 0.05 * max(a, b) + 1e-7, (call["call_index"], kernel, a, b)
