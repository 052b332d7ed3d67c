"""``fla.modules``: the modules fusedops implements (FLA's aliases ``fused_norm_gate``,
``layernorm_gated``, ``l2norm`` and ``convolution`` included)."""

from .causal_conv1d import ShortConvolution
from .fused_cross_entropy import FusedCrossEntropyLoss
from .fused_linear_cross_entropy import FusedLinearCrossEntropyLoss
from .norm import FusedRMSNormGated, FusedRMSNormSwishGate, L2Norm

__all__ = [
    "FusedCrossEntropyLoss",
    "FusedLinearCrossEntropyLoss",
    "FusedRMSNormGated",
    "FusedRMSNormSwishGate",
    "L2Norm",
    "ShortConvolution",
]
