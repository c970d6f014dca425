"""A plug-in kernel naming an extension attnreplay does not know ("windows"): its file is refused, named."""
import attnreplay_plugin as ar


class Misspelled(ar.Kernel):
    name = "py-misspelled-extension"
    device = "cpu"
    extensions = ("windows",)

    def run(self, inputs):
        return inputs.q


ar.register(Misspelled())
