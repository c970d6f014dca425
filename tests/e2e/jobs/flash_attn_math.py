"""What a flash-attn call computes, in plain torch, for the stand-in jobs that register ops under
flash-attn's names and its builds' (flash_attn_op_job.py, flash_attn_varlen_job.py,
sglang_fa3_job.py): the scaled scores with softcap and ALiBi, which keys each query row may see
(causality and windows aligned bottom-right as flash-attn aligns them), sinks, and ragged and paged
batches sequence by sequence, as FlashAttention-3's forward op takes them."""
import math

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


def attend(q, k, v, scale, causal, window_left, window_right, softcap, alibi_slopes, sinks=None):
    """One sequence: q (s_q, h, d), k and v (s_k, h_kv, d), in float32. sinks (h,): one logit per
    head that joins each row's softmax denominator, adding no value."""
    heads, heads_kv = q.shape[1], k.shape[1]
    k = k.repeat_interleave(heads // heads_kv, dim=1)
    v = v.repeat_interleave(heads // heads_kv, dim=1)
    qh, kh, vh = (t.transpose(0, 1).float() for t in (q, k, v))  # (h, s, d)
    scores, allowed = scores_and_visibility(qh, kh, scale, causal, window_left, window_right, softcap,
                                            alibi_slopes)
    scores = scores.masked_fill(~allowed, -math.inf)
    seen = allowed.any(dim=-1, keepdim=True)
    logits = torch.where(seen, scores, torch.zeros_like(scores))
    if sinks is not None:
        sink = sinks.float().view(-1, 1, 1).expand(-1, logits.shape[1], 1)
        probabilities = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1] * seen
    else:
        probabilities = torch.softmax(logits, dim=-1) * seen
    return (probabilities @ vh).transpose(0, 1)  # (s_q, h, d)


def offsets(lengths):
    """Sequence lengths as flash-attn's int32 offsets (cu_seqlens)."""
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def keys_of(k, v, b, k_offsets, used, table):
    """Sequence b's keys and values: packed rows, or the first `used` tokens of its pages."""
    if table is None:
        first = int(k_offsets[b])
        count = int(used[b]) if used is not None else int(k_offsets[b + 1]) - first
        return k[first:first + count], v[first:first + count]
    count = int(used[b]) if used is not None else int(k_offsets[b + 1] - k_offsets[b])
    page_size = k.shape[1]
    pages = table[b, :(count + page_size - 1) // page_size].long()
    return k[pages].flatten(0, 1)[:count], v[pages].flatten(0, 1)[:count]


def varlen(q, k, v, q_offsets, k_offsets, used, table, scale, causal, window_left, window_right, softcap,
           alibi_slopes, sinks=None):
    """A ragged batch: q packed by q_offsets; keys packed by k_offsets, or pages listed by table;
    `used` (or the offsets) counts each sequence's keys."""
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.float32)
    for b in range(q_offsets.numel() - 1):
        first, end = int(q_offsets[b]), int(q_offsets[b + 1])
        keys, values = keys_of(k, v, b, k_offsets, used, table)
        if end > first and keys.shape[0] > 0:
            slopes = None if alibi_slopes is None else (alibi_slopes[b] if alibi_slopes.dim() == 2 else alibi_slopes)
            out[first:end] = attend(q[first:end], keys, values, scale, causal, window_left, window_right, softcap,
                                    slopes, sinks)
    return out.to(q.dtype)


def fa3_fwd(q, k, v, k_new=None, v_new=None, q_v=None, out=None, cu_seqlens_q=None, cu_seqlens_k=None,
            cu_seqlens_k_new=None, seqused_q=None, seqused_k=None, max_seqlen_q=None, max_seqlen_k=None,
            page_table=None, kv_batch_idx=None, leftpad_k=None, rotary_cos=None, rotary_sin=None,
            seqlens_rotary=None, q_descale=None, k_descale=None, v_descale=None, softmax_scale=None,
            is_causal=False, window_size_left=-1, window_size_right=-1, attention_chunk=0, softcap=0.0,
            is_rotary_interleaved=False, scheduler_metadata=None, num_splits=0, pack_gqa=None, sm_margin=0,
            sinks=None):
    """FlashAttention-3's forward op (hopper/flash_api.cpp's mha_fwd): a dense (batch, seq, heads,
    dim) or packed query over packed keys, a paged cache (page_table) or a dense cache cut by
    seqused_k; k_new appended to a dense cache first."""
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    dense_q = cu_seqlens_q is None
    batch, seq_q = (q.shape[0], q.shape[1]) if dense_q else (cu_seqlens_q.numel() - 1, None)
    rows = q.flatten(0, 1) if dense_q else q
    q_offsets = torch.arange(batch + 1) * seq_q if dense_q else cu_seqlens_q
    if k_new is not None:
        # Appended at each sequence's end of the cache, then attended to with it.
        k, v = k.clone(), v.clone()
        used = seqused_k.clone()
        for b in range(batch):
            at = int(used[b])
            k[b, at:at + k_new.shape[1]] = k_new[b]
            v[b, at:at + v_new.shape[1]] = v_new[b]
        seqused_k = used + k_new.shape[1]
    k_offsets = cu_seqlens_k
    if page_table is None and cu_seqlens_k is None:  # a dense cache: sequence b's keys are k[b]
        k_offsets = torch.arange(batch + 1) * k.shape[1]
        k, v = k.flatten(0, 1), v.flatten(0, 1)
    result = varlen(rows, k, v, q_offsets, k_offsets, seqused_k, page_table, softmax_scale, is_causal,
                    window_size_left, window_size_right, softcap, None, sinks)
    result = result.view(q.shape[0], q.shape[1], q.shape[2], -1) if dense_q else result
    return result, q.new_empty(0), q.new_empty(0), q.new_empty(0)
