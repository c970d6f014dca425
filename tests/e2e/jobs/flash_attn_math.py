"""What a flash-attn call computes before its softmax, in plain torch, for the stand-in jobs that
register ops under flash-attn's names (flash_attn_op_job.py, flash_attn_varlen_job.py): the scaled
scores with softcap and ALiBi, and which keys each query row may see, causality and windows
aligned bottom-right as flash-attn aligns them."""
import torch


def scores_and_visibility(qh, kh, scale, causal, window_left, window_right, softcap, alibi_slopes):
    """qh (..., heads, s_q, d) and kh (..., heads, s_k, d) in float32; alibi_slopes one per head or
    None. Returns the scores, unmasked, and the (s_q, s_k) bool matrix of keys each row sees."""
    scores = qh @ kh.transpose(-1, -2) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    sq, sk = scores.shape[-2:]
    rows = torch.arange(sq).unsqueeze(1) + (sk - sq)
    cols = torch.arange(sk).unsqueeze(0)
    if alibi_slopes is not None:
        scores = scores - alibi_slopes.view(-1, 1, 1) * (rows - cols).abs()
    visible = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        visible &= cols <= rows
    if window_left >= 0:
        visible &= cols >= rows - window_left
    if window_right >= 0:
        visible &= cols <= rows + window_right
    return scores, visible
