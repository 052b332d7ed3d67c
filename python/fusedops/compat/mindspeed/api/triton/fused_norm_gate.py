"""``mindspeed_ops.api.triton.fused_norm_gate``: the gated RMSNorm (MindSpeed ships FLA's
``fused_norm_gate``, so its call forms are FLA's)."""

from fusedops.compat.fla.modules.norm.fused_norm_gate import FusedRMSNormGated, rms_norm_gated

__all__ = ["FusedRMSNormGated", "rms_norm_gated"]
