"""CPU copies of the library adapters, for tests with the stand-in packages on PYTHONPATH: the same
adapter objects (argument mapping, preparation) registered again as '<name>-on-cpu', device cpu.
attnreplay imports an adapter only when one of its kernels runs; this imports them all first."""
import copy
import os

import attnreplay_plugin as ar

ar._load_adapters(os.path.join(os.path.dirname(os.path.abspath(ar.__file__)), "..", "adapters"))
for entry in list(ar._registered):
    if entry.source.endswith("_adapter.py"):
        kernel = copy.copy(entry.kernel)
        kernel.name = entry.kernel.name + "-on-cpu"
        kernel.device = "cpu"
        ar.register(kernel)
