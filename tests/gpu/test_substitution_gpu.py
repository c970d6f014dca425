"""Kernel substitution in a GPU job (ATTNCAP_SUBSTITUTE), run by bench/gpu.sh on the GPU machine.

A kernel that takes the job's own tensors (kernels/resident_kernel.h) computes there, on the job's
stream, with nothing copied to the host; what it gives the job must be exactly what the same kernel
gives the same call in a replay, which goes through the host. Checked here bit for bit, on SDPA
calls as models make them: contiguous, transposed views of (b, s, h, d) projections, grouped-query
(decode steps with their query heads packed among them), a left-padded batch (each entry cut to its keys, docs/masks.md), and a masked call that the CUDA
kernels leave to the op.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("ATTNREPLAY_BIN", str(ROOT / "build/replay/attnreplay"))
ATTNCAP = os.environ.get("ATTNREPLAY_ATTNCAP_LIB", str(ROOT / "build/capture/libattncap.so"))
sys.path.insert(0, str(ROOT / "formats/python"))
from attnreplay_h5 import read_calls  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

JOB = r'''
import sys
import torch
import torch.nn.functional as F
torch.manual_seed(0)
bf16 = dict(device="cuda", dtype=torch.bfloat16)
outs = {}
with torch.no_grad():
    q, k, v = (torch.randn(1, 4, 300, 64, **bf16) for _ in range(3))
    outs["contiguous"] = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # A projection's (b, s, h, d) output seen as (b, h, s, d), as transformers hands SDPA its inputs.
    q, k, v = (torch.randn(2, 130, 8, 128, **bf16).transpose(1, 2) for _ in range(3))
    outs["transposed"] = F.scaled_dot_product_attention(q, k, v)
    q = torch.randn(1, 8, 100, 128, **bf16)
    k, v = (torch.randn(1, 2, 100, 128, **bf16) for _ in range(2))
    outs["gqa"] = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    q, k, v = (torch.randn(1, 2, 64, 64, **bf16) for _ in range(3))
    mask = torch.rand(1, 1, 64, 64, device="cuda") > 0.3
    outs["masked"] = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    # A left-padded batch's prefill, as transformers masks it: keys from 0, 20 and 60 on, causal.
    q, k, v = (torch.randn(3, 4, 96, 64, **bf16) for _ in range(3))
    keys = torch.arange(96, device="cuda")[None, :] >= torch.tensor([0, 20, 60], device="cuda")[:, None]
    padded = keys[:, None, None, :] & torch.ones(96, 96, dtype=torch.bool, device="cuda").tril()
    outs["padded"] = F.scaled_dot_product_attention(q, k, v, attn_mask=padded)
    # GQA's query heads packed as rows (kernels/quantized_attention.h): a decode step of one
    # sequence, its query a (b, 1, h, d) projection's view, its keys a (b, h, s, d) cache, split
    # across CTAs; and 4 rows from (b, s, h, d) views, which the kernels read as bhsd rows.
    q = torch.randn(1, 1, 8, 128, **bf16).transpose(1, 2)
    k, v = (torch.randn(1, 2, 4000, 128, **bf16) for _ in range(2))
    outs["decode"] = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    q = torch.randn(2, 4, 8, 128, **bf16).transpose(1, 2)
    k, v = (torch.randn(2, 300, 2, 128, **bf16).transpose(1, 2) for _ in range(2))
    outs["rows4"] = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
torch.save({name: out.cpu() for name, out in outs.items()}, sys.argv[1])
'''
NAMES = ["contiguous", "transposed", "gqa", "masked", "padded", "decode", "rows4"]


def run_job(tmp_path, name, **env):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    out = tmp_path / f"{name}.pt"
    result = subprocess.run([sys.executable, job, out], env=dict(os.environ, LD_PRELOAD=ATTNCAP, **env),
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return torch.load(out, weights_only=True), result.stderr


@pytest.mark.parametrize("kernel", ["sage2-int8-fp8", "fa3-fp8", "torch-cudnn"])
def test_a_kernel_on_the_jobs_tensors_gives_what_it_gives_in_a_replay(tmp_path, kernel):
    plain, _ = run_job(tmp_path, "plain")
    caps = tmp_path / "caps"
    substituted, stderr = run_job(tmp_path, "substituted", ATTNCAP_SUBSTITUTE=kernel, ATTNCAP_OUT=str(caps))
    summary = [line for line in stderr.splitlines() if "substitution by" in line or " left: " in line]
    print("\n".join(summary))
    ours = kernel != "torch-cudnn"  # attnreplay's CUDA kernels take no mask but padding's
    taken = 6 if ours else 7
    assert f"{taken} attention calls substituted (on the job's own tensors" in summary[0], summary
    if ours:
        assert "1 left: the CUDA kernels take a mask only as padding" in "\n".join(summary), summary
        assert torch.equal(substituted["masked"], plain["masked"])  # the op's own output

    calls = read_calls(str(next(caps.rglob("*.h5"))), as_torch=True)
    assert len(calls) == 7
    outs = tmp_path / "outs"
    result = subprocess.run([BIN, "run", str(caps), "--kernels", kernel, "--save-outputs", str(outs), "-q",
                             "--min-samples", "3", "--min-time", "0", "--timeout", "1", "--no-ceilings"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    for name, call in zip(NAMES, calls):
        if "substituted_by" not in call["metadata"]:
            continue
        assert call["metadata"]["substituted_by"] == kernel
        # The job got the kernel's output, and the capture recorded it with the call's inputs whole.
        assert torch.equal(call["out"].cpu(), substituted[name]), name
        replayed = torch.load(outs / f"call{call['call_index']}_{kernel}.pt", weights_only=True)["out"]
        assert torch.equal(replayed, substituted[name]), (name, (replayed.float() - substituted[name].float()).abs().max())
        assert not torch.equal(substituted[name], plain[name]) or kernel == "torch-cudnn", name
