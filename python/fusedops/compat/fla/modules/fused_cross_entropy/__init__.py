"""``fla.modules.fused_cross_entropy``."""

from .ops import FusedCrossEntropyLoss, cross_entropy_loss

__all__ = ["FusedCrossEntropyLoss", "cross_entropy_loss"]
