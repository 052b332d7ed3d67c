"""``fla.modules.norm``: the gated RMSNorms and L2Norm fusedops implements."""

from .fused_norm_gate import FusedRMSNormGated, FusedRMSNormSwishGate
from .l2norm import L2Norm
from .layernorm_gated import RMSNormGated

__all__ = ["FusedRMSNormGated", "FusedRMSNormSwishGate", "L2Norm", "RMSNormGated"]
