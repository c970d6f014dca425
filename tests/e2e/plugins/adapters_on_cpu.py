"""CPU copies of the library adapters, for tests with the stand-in packages on PYTHONPATH: the same
adapter objects (argument mapping, preparation) registered again as '<name>-on-cpu', device cpu."""
import copy

import attnreplay_plugin as ar

for entry in list(ar._registered):
    if entry.source.endswith("_adapter.py"):
        kernel = copy.copy(entry.kernel)
        kernel.name = entry.kernel.name + "-on-cpu"
        kernel.device = "cpu"
        ar.register(kernel)
