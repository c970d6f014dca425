#!/usr/bin/env bash
# How long a process takes to end after its last work, attnreplay against bare torch (teardown.txt); run from the repository root after bench/gpu.sh built build-gpu.
for i in 1 2 3; do
  python3 - <<'PY'
import subprocess, time, os
code = "import torch, time; x = torch.zeros(1, device='cuda'); torch.cuda.synchronize(); print(time.time(), flush=True)"
t0 = time.time(); r = subprocess.run(["python3", "-c", code], capture_output=True, text=True); t1 = time.time()
print(f"torch, CUDA context, 4 B: start to last work {float(r.stdout.split()[0]) - t0:.3f} s, teardown {t1 - float(r.stdout.split()[0]):.3f} s")
code = "import torch, time; x = torch.empty(4 << 30, dtype=torch.uint8, device='cuda'); x.fill_(1); torch.cuda.synchronize(); print(time.time(), flush=True)"
t0 = time.time(); r = subprocess.run(["python3", "-c", code], capture_output=True, text=True); t1 = time.time()
print(f"torch, CUDA context, 4 GiB: start to last work {float(r.stdout.split()[0]) - t0:.3f} s, teardown {t1 - float(r.stdout.split()[0]):.3f} s")
for shape, kernels in (("1,1,128,64", "flash"), ("1,24,4608,128", "flash"), ("1,24,4608,128", "torch-cudnn,torch-efficient,torch-flash,flash,sage2-int8-fp8")):
    t0 = time.time()
    r = subprocess.run(["build-gpu/replay/attnreplay", "run", "--shape", shape, "--dtype", "bf16", "--kernels", kernels, "--json", "/tmp/td.json", "-q"], capture_output=True, text=True)
    t1 = time.time()
    print(f"attnreplay {shape} {kernels}: teardown after the record file {t1 - os.path.getmtime('/tmp/td.json'):.3f} s")
t0 = time.time(); subprocess.run(["build-gpu/replay/attnreplay", "kernels"], capture_output=True); print(f"attnreplay kernels: {time.time() - t0:.3f} s whole")
PY
done
