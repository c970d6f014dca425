"""A plug-in kernel whose `headline` is none of "kernel", "call", "run": refused, naming the file."""
import attnreplay_plugin as ar


@ar.kernel("py-bad-headline", device="cpu", dtypes=("float32",), headline="both")
def bad(inputs):
    return inputs.q
