"""Test stand-in for flashinfer.quantization's packbits (flashinfer 0.6.18), and its inverse."""
import torch


def packbits(x, bitorder="big"):
    bits = x.reshape(-1).to(torch.bool)
    padded = torch.zeros(-(-bits.numel() // 8) * 8, dtype=torch.uint8)
    padded[:bits.numel()] = bits.to(torch.uint8)
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128] if bitorder == "little" else [128, 64, 32, 16, 8, 4, 2, 1],
                           dtype=torch.uint8)
    return (padded.view(-1, 8) * weights).sum(dim=1).to(torch.uint8)


def _unpack_little(packed, count):
    shifts = torch.arange(8, dtype=torch.uint8)
    bits = (packed[:, None] >> shifts) & 1
    return bits.reshape(-1)[:count].to(torch.bool)
