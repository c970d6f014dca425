"""Test stand-in for SageAttention2's compiled sm89 extension `sageattention._qattn_sm89`, not the
library: its FP8 attention kernels (CTA of 128 query rows and 64 keys), see _stand_in_kernels.py."""
from ._stand_in_kernels import make_kernel

LAST_CALL = {}
qk_int8_sv_f8_accum_f32_fuse_v_scale_attn = make_kernel(
    "_qattn_sm89", "qk_int8_sv_f8_accum_f32_fuse_v_scale_attn", 128, 64, LAST_CALL)
qk_int8_sv_f8_accum_f32_fuse_v_scale_attn_inst_buf = make_kernel(
    "_qattn_sm89", "qk_int8_sv_f8_accum_f32_fuse_v_scale_attn_inst_buf", 128, 64, LAST_CALL)
qk_int8_sv_f8_accum_f16_fuse_v_scale_attn_inst_buf = make_kernel(
    "_qattn_sm89", "qk_int8_sv_f8_accum_f16_fuse_v_scale_attn_inst_buf", 128, 64, LAST_CALL)
