"""reference-cuda timed as a kernel on masked and extended calls, by one or more builds in turns.

    python3 masked_reference_times.py BUILD/replay/attnreplay [OTHER_BUILD/replay/attnreplay]
"""
import json, subprocess, sys, tempfile
from pathlib import Path
import torch

def call(b, hq, hkv, sq, skv, d, mask_kind=None, **extra):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, hq, sq, d, generator=g).bfloat16()
    k, v = (torch.randn(b, hkv, skv, d, generator=g).bfloat16() for _ in range(2))
    c = {"format": "attnreplay.call", "schema_version": 2, "q": q, "k": k, "v": v, "enable_gqa": hq != hkv}
    if mask_kind == "padding":  # left padding as the serving trace has it
        keys = torch.arange(skv); queries = torch.arange(skv - sq, skv)
        visible = keys[None, :] <= queries[:, None]
        pads = torch.stack([keys >= (i * 37) % 100 for i in range(b)])
        c["mask"] = (visible[None] & pads[:, None, :])[:, None]
    elif mask_kind == "float":
        c["mask"] = torch.randn(b, 1, sq, skv, generator=g).bfloat16()
    c.update(extra)
    return c

CASES = {
    "prefill 4x32x384 d128 padding": call(4, 32, 8, 384, 384, 128, "padding"),
    "decode 4x32x1x399 d128 padding": call(4, 32, 8, 1, 399, 128, "padding"),
    "2x32x2048 d128 float mask": call(2, 32, 8, 2048, 2048, 128, "float"),
    "1x24x4608 d128 plain": call(1, 24, 24, 4608, 4608, 128),
    "1x24x4608 d128 float mask": call(1, 24, 24, 4608, 4608, 128, "float"),
    "1x16x4096 d128 causal window 1024 softcap 50": call(1, 16, 16, 4096, 4096, 128, None, is_causal=True,
                                                         window_left=1024, softcap=50.0),
}

def main():
    bins = sys.argv[1:]
    tmp = Path(tempfile.mkdtemp())
    for name, c in CASES.items():
        path = tmp / (name.replace(" ", "_") + ".pt")
        torch.save(c, path)
        for round_ in (1, 2):
            for binary in bins:
                out = tmp / "r.json"
                r = subprocess.run([binary, "run", str(path), "--kernels", "reference-cuda", "--json", str(out), "-q"],
                                   capture_output=True, text=True)
                if r.returncode:
                    print(name, binary, "failed", r.stderr[-800:]); continue
                k = json.loads(out.read_text())["calls"][0]["kernels"][0]
                t = k.get("timing") or {}
                print(f"round {round_} {Path(binary).parts[-3]:<16} {name:<46} {k['status']:<13} "
                      f"median {t.get('median_s', 0) * 1e3:9.3f} ms", flush=True)

main()
