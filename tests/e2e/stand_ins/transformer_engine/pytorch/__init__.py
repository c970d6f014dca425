"""Test stand-in for `transformer_engine.pytorch`, not the library: `DotProductAttention` with
Transformer Engine's signature and conventions, computed with torch in float64 on the CPU.

Conventions followed (TE 2.20, transformer_engine/pytorch/attention/dot_product_attention/
dot_product_attention.py): the module is built with num_attention_heads, kv_channels (an int, or
(head_dim_qk, head_dim_v)), num_gqa_groups (heads of K and V; default num_attention_heads),
qkv_format ("sbhd" by default, "bshd", "thd"), attn_mask_type ("causal" by default; "no_mask",
"causal" top-left, "causal_bottom_right", "arbitrary"), softmax_scale (default 1/sqrt(head_dim_qk));
forward(query_layer, key_layer, value_layer, attention_mask=None, ...) checks the heads and head dims
against the module's and returns (batch, seq_q, heads * head_dim_v) for "bshd" ((seq_q, batch, ...)
for "sbhd"). An "arbitrary" attention_mask is bool, broadcastable to (batch, heads, seq_q, seq_kv), and
True means masked OUT. Padding masks, "thd", dropout and biases are not emulated and raise. The last
call's arguments (constructor and forward) are in LAST_CALL.
"""
import torch

from _stand_in_math import attention_fp64, causal_visible
from _stand_in_record import record

LAST_CALL = {}
MASK_TYPES = ("no_mask", "padding", "causal", "padding_causal", "causal_bottom_right",
              "padding_causal_bottom_right", "arbitrary")


class DotProductAttention(torch.nn.Module):
    def __init__(self, num_attention_heads, kv_channels, num_gqa_groups=None, attention_dropout=0.0,
                 qkv_format="sbhd", attn_mask_type="causal", window_size=None, bottom_right_diagonal=None,
                 sequence_parallel=False, tp_size=1, get_rng_state_tracker=None, tp_group=None, layer_number=None,
                 attention_type="self", cp_group=None, cp_global_ranks=None, cp_stream=None, cp_comm_type="p2p",
                 softmax_scale=None, softmax_type="vanilla", return_max_logit=False, name=None):
        super().__init__()
        self.init_arguments = {key: value for key, value in locals().items() if key not in ("self", "__class__")}
        attn_mask_type = attn_mask_type.replace(",", "_")
        if attn_mask_type not in MASK_TYPES:
            raise AssertionError(f"attn_mask_type {attn_mask_type} not supported")
        if qkv_format not in ("sbhd", "bshd", "thd"):
            raise AssertionError(f"qkv_format {qkv_format} not supported")
        if attention_type not in ("self", "cross"):
            raise AssertionError(f"attention_type {attention_type} not supported")
        self.heads = num_attention_heads
        self.heads_kv = num_gqa_groups or num_attention_heads
        self.head_dim_k, self.head_dim_v = (kv_channels, kv_channels) if isinstance(kv_channels, int) else kv_channels
        self.qkv_format, self.attn_mask_type = qkv_format, attn_mask_type
        self.attention_dropout = attention_dropout
        self.softmax_scale = softmax_scale if softmax_scale is not None else self.head_dim_k ** -0.5

    def forward(self, query_layer, key_layer, value_layer, attention_mask=None, qkv_format=None, cu_seqlens_q=None,
                cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None, attn_mask_type=None, window_size=None,
                core_attention_bias_type="no_bias", core_attention_bias=None, alibi_slopes=None):
        record(LAST_CALL, locals(), tensors=("query_layer", "key_layer", "value_layer"))
        LAST_CALL.pop("self")
        LAST_CALL["init"] = dict(self.init_arguments)
        q, k, v = query_layer, key_layer, value_layer
        qkv_format = qkv_format or self.qkv_format
        mask_type = (attn_mask_type or self.attn_mask_type).replace(",", "_")
        if q.dtype != k.dtype or q.dtype != v.dtype:
            raise AssertionError("Queries, keys and values must have the same data type!")
        if qkv_format == "sbhd":
            q, k, v = (t.transpose(0, 1) for t in (q, k, v))
        elif qkv_format != "bshd":
            raise NotImplementedError(f"the stand-in does not emulate qkv_format {qkv_format}")
        if tuple(k.shape[:-1]) != tuple(v.shape[:-1]):
            raise AssertionError("Keys and values must have the same batch size, sequence length and number of heads!")
        if q.shape[-1] != k.shape[-1]:
            raise AssertionError("Queries and keys must have the same head dimension!")
        if q.shape[-1] != self.head_dim_k or v.shape[-1] != self.head_dim_v:
            raise AssertionError(f"head dims {q.shape[-1]}, {v.shape[-1]} != kv_channels "
                                 f"{(self.head_dim_k, self.head_dim_v)}")
        if q.shape[-2] != self.heads or k.shape[-2] != self.heads_kv:
            raise AssertionError(f"Keys and values must have num_gqa_group = {self.heads_kv} heads!")
        if self.attention_dropout or core_attention_bias is not None or alibi_slopes is not None or window_size:
            raise NotImplementedError("the stand-in does not emulate dropout, biases, ALiBi or windows")
        batch, seq_q = q.shape[:2]
        seq_kv = k.shape[1]
        if mask_type == "arbitrary":
            if attention_mask is None or attention_mask.dtype != torch.bool:
                raise AssertionError("an 'arbitrary' mask must be given as a bool tensor")
            visible = ~attention_mask.expand(batch, self.heads, seq_q, seq_kv)
        elif mask_type in ("no_mask", "causal", "causal_bottom_right"):
            if attention_mask is not None:
                raise AssertionError(f"attention_mask must be None for attn_mask_type {mask_type}")
            offsets = {"causal": 0, "causal_bottom_right": seq_kv - seq_q}
            visible = causal_visible(seq_q, seq_kv, offsets[mask_type]) if mask_type in offsets else None
        else:
            raise NotImplementedError(f"the stand-in does not emulate attn_mask_type {mask_type}")
        out = attention_fp64(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), self.softmax_scale, visible)
        out = out.transpose(1, 2).reshape(batch, seq_q, self.heads * self.head_dim_v).to(q.dtype)
        return out.transpose(0, 1) if qkv_format == "sbhd" else out
