"""Test stand-in for SageAttention2's compiled sm90 extension `sageattention._qattn_sm90`, not the
library: its FP8 attention kernel (CTA of 64 query rows and 128 keys), see _stand_in_kernels.py."""
from ._stand_in_kernels import make_kernel

LAST_CALL = {}
qk_int8_sv_f8_accum_f32_fuse_v_scale_attn_inst_buf = make_kernel(
    "_qattn_sm90", "qk_int8_sv_f8_accum_f32_fuse_v_scale_attn_inst_buf", 64, 128, LAST_CALL)
