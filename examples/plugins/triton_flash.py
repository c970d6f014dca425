"""A Triton flash-attention forward as an attnreplay plug-in kernel: a template to copy.

    attnreplay run caps/ --kernel-module examples/plugins/triton_flash.py --kernels triton-flash,torch-flash

One program computes BLOCK_M query rows of one (batch, head) with an online softmax over blocks
of BLOCK_N keys, in fp32, from fp16/bf16 Q, K, V. It takes GQA as it is (a query head reads its
group's K and V head) and both causal alignments (the diagonal moved by seq_kv - seq_q for
flash-attn's bottom-right).
"""

import torch
import triton
import triton.language as tl

import attnreplay_plugin as ar

LOG2_E = 1.4426950408889634


@triton.jit
def _flash_forward(Q, K, V, O, scale_log2, seq_q, seq_kv, causal_shift,
                   stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
                   stride_vb, stride_vh, stride_vs, stride_ob, stride_oh, stride_os,
                   HEADS_Q: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    block_m = tl.program_id(0)
    batch = tl.program_id(1) // HEADS_Q
    head = tl.program_id(1) % HEADS_Q
    kv_head = head // GROUP
    rows = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + batch * stride_qb + head * stride_qh + rows[:, None] * stride_qs + dims[None, :],
                mask=rows[:, None] < seq_q, other=0.0)
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh

    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # Under causality the block's last row sees no key past this one.
    end = seq_kv
    if CAUSAL:
        end = tl.minimum(seq_kv, (block_m + 1) * BLOCK_M + causal_shift)
    for start in range(0, end, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        k = tl.load(k_base + keys[None, :] * stride_ks + dims[:, None], mask=keys[None, :] < seq_kv, other=0.0)
        scores = tl.dot(q, k) * scale_log2  # in log2 units, for exp2
        visible = keys[None, :] < seq_kv
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None] + causal_shift)
        scores = tl.where(visible, scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        # A row that has seen no key yet keeps -inf: subtract 0 instead, so no inf - inf.
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        p = tl.math.exp2(scores - shift[:, None])
        correction = tl.math.exp2(row_max - shift)
        row_sum = row_sum * correction + tl.sum(p, 1)
        v = tl.load(v_base + keys[:, None] * stride_vs + dims[None, :], mask=keys[:, None] < seq_kv, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * correction[:, None])
        row_max = new_max
    # Rows that see no key at all give 0, as the reference does.
    out = tl.where(row_sum[:, None] > 0, acc / row_sum[:, None], 0.0)
    tl.store(O + batch * stride_ob + head * stride_oh + rows[:, None] * stride_os + dims[None, :],
             out.to(O.dtype.element_ty), mask=rows[:, None] < seq_q)


class TritonFlash(ar.Kernel):
    name = "triton-flash"
    summary = "Triton flash-attention forward (examples/plugins/triton_flash.py)"
    device = "cuda"
    layout = "bhsd"
    dtypes = ("float16", "bfloat16")
    head_dims = (16, 32, 64, 128)  # tl.arange needs a power of two
    native_gqa = True
    causal_alignments = ("top_left", "bottom_right")

    def run(self, inputs):
        q, k, v, spec = inputs.q, inputs.k, inputs.v, inputs.spec
        out = torch.empty_like(q)
        block_m, block_n = 128, 64 if spec.head_dim_qk <= 64 else 32
        grid = (triton.cdiv(spec.seq_q, block_m), spec.batch * spec.heads_q)
        causal_shift = spec.seq_kv - spec.seq_q if spec.causal_alignment == "bottom_right" else 0
        _flash_forward[grid](
            q, k, v, out, spec.scale * LOG2_E, spec.seq_q, spec.seq_kv, causal_shift,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
            HEADS_Q=spec.heads_q, GROUP=spec.heads_q // spec.heads_kv, HEAD_DIM=spec.head_dim_qk,
            BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=spec.is_causal,
            num_warps=4 if spec.head_dim_qk <= 64 else 8, num_stages=3)
        return out


ar.register(TritonFlash())
