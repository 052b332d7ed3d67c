"""``mindspeed_ops.api.triton.fused_cross_entropy_loss``: ``FusedCrossEntropyLossFunction``."""

from fusedops.ops.cross_entropy import FusedCrossEntropyLossFunction

__all__ = ["FusedCrossEntropyLossFunction"]
