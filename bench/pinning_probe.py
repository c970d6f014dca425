"""Host-to-GPU copy rates behind replay's uploads (docs/scaling.md): 113 MB (one Flux-sized call)
from pageable memory, the cost of page-locking it in place, from pinned memory, and torch's copy
into pinned memory.

    python bench/pinning_probe.py
"""
import time, torch
n = 113 * 2**20
host = torch.empty(n, dtype=torch.uint8); host.fill_(1)
dev = torch.empty(n, dtype=torch.uint8, device="cuda")
def t(f, reps=5):
    best = 1e9
    for _ in range(reps):
        torch.cuda.synchronize(); s = time.perf_counter(); f(); torch.cuda.synchronize(); best = min(best, time.perf_counter() - s)
    return best
print("pageable H2D", n / t(lambda: dev.copy_(host)) / 1e9, "GB/s")
cr = torch.cuda.cudart()
def reg():
    cr.cudaHostRegister(host.data_ptr(), n, 0)
def unreg():
    cr.cudaHostUnregister(host.data_ptr())
s = time.perf_counter(); reg(); r = time.perf_counter() - s
print("register", r * 1e3, "ms", n / r / 1e9, "GB/s")
print("registered H2D", n / t(lambda: dev.copy_(host)) / 1e9, "GB/s")
s = time.perf_counter(); unreg(); print("unregister", (time.perf_counter() - s) * 1e3, "ms")
pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
print("pinned H2D", n / t(lambda: dev.copy_(pinned)) / 1e9, "GB/s")
print("memcpy into pinned", n / t(lambda: pinned.copy_(host)) / 1e9, "GB/s")
big = torch.empty(n // 2, dtype=torch.float64, device="cuda")
print("bf16->fp64 widen", t(lambda: dev[: n // 2].view(torch.bfloat16).double()) * 1e3, "ms")
