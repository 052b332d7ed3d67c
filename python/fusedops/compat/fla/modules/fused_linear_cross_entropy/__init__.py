"""``fla.modules.fused_linear_cross_entropy``."""

from .ops import FusedLinearCrossEntropyLoss, fused_linear_cross_entropy_loss

__all__ = ["FusedLinearCrossEntropyLoss", "fused_linear_cross_entropy_loss"]
