"""Test stand-in helper, not a library: how the stand-ins record the arguments of their last call."""


def record(last_call: dict, arguments: dict, tensors=()) -> None:
    """Replaces `last_call` with the call's arguments other than the named tensors (whose shapes and
    dtypes are recorded under '<name>.shape' and '<name>.dtype' instead)."""
    last_call.clear()
    for name, value in arguments.items():
        if name in tensors:
            last_call[name + ".shape"] = tuple(value.shape)
            last_call[name + ".dtype"] = value.dtype
        else:
            last_call[name] = value
