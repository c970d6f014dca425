"""Test stand-in for `xformers.ops.fmha.attn_bias`, not the library: the causal bias classes the
adapter uses, with xFormers' alignments (LowerTriangularMask: key j visible to query i when j <= i;
LowerTriangularFromBottomRightMask: when j <= i + seq_kv - seq_q)."""


class AttentionBias:
    pass


class LowerTriangularMask(AttentionBias):
    def __init__(self, device=None):
        pass

    def add_bias(self, bias):
        return LowerTriangularMaskWithTensorBias(bias)


class LowerTriangularMaskWithTensorBias(LowerTriangularMask):
    def __init__(self, bias):
        self._bias = bias


class LowerTriangularFromBottomRightMask(AttentionBias):
    pass
