"""Module wrappers (torch.nn.Module) around the fusedops functional API."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


class FusedCrossEntropyLoss(torch.nn.Module):
    """Cross-entropy with the gradient computed in the forward, backed by
    :func:`fusedops.fused_cross_entropy_loss` (the options of flash-linear-attention's
    ``FusedCrossEntropyLoss`` plus MindSpeed's per-token ``loss_weight``).

    ``forward(logits, target, loss_weight=None)`` returns the loss, or ``(loss, z_loss)`` with
    ``return_z_loss``. ``reduction=None`` means ``"sum"`` when a ``loss_weight`` is given and
    ``"mean"`` otherwise.
    """

    def __init__(self, ignore_index: int = -100, reduction: Optional[str] = None,
                 label_smoothing: float = 0.0, logit_scale: float = 1.0,
                 logit_softcapping: Optional[float] = None, lse_square_scale: float = 0.0,
                 return_z_loss: bool = False, inplace_backward: bool = False) -> None:
        super().__init__()
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.logit_scale = logit_scale
        self.logit_softcapping = logit_softcapping
        self.lse_square_scale = lse_square_scale
        self.return_z_loss = return_z_loss
        self.inplace_backward = inplace_backward

    def forward(self, logits: Tensor, target: Tensor, loss_weight: Optional[Tensor] = None):
        from .ops.cross_entropy import fused_cross_entropy_loss

        return fused_cross_entropy_loss(
            logits, target, loss_weight, ignore_index=self.ignore_index, reduction=self.reduction,
            label_smoothing=self.label_smoothing, logit_scale=self.logit_scale,
            logit_softcapping=self.logit_softcapping, lse_square_scale=self.lse_square_scale,
            return_z_loss=self.return_z_loss, inplace_backward=self.inplace_backward)


class ChunkLoss(torch.nn.Module):
    """The LM head and cross-entropy without materialized logits, backed by
    :func:`fusedops.chunk_loss`: ``forward(hidden, weight, labels, loss_weight=None, alpha=None)``
    returns ``CE(hidden @ weight.T)`` (and the z-loss with ``return_z_loss``)."""

    def __init__(self, chunk_size: Optional[int] = None, ignore_index: int = -100,
                 reduction: str = "sum", label_smoothing: float = 0.0, lse_square_scale: float = 0.0,
                 softcap: Optional[float] = None, logit_scale: float = 1.0,
                 memory_budget: Optional[int] = None, return_z_loss: bool = False) -> None:
        super().__init__()
        self.chunk_size = chunk_size
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.lse_square_scale = lse_square_scale
        self.softcap = softcap
        self.logit_scale = logit_scale
        self.memory_budget = memory_budget
        self.return_z_loss = return_z_loss

    def forward(self, hidden: Tensor, weight: Tensor, labels: Tensor,
                loss_weight: Optional[Tensor] = None, alpha=None):
        from .ops.chunk_loss import chunk_loss

        return chunk_loss(hidden, weight, labels, loss_weight, chunk_size=self.chunk_size,
                          ignore_index=self.ignore_index, reduction=self.reduction, alpha=alpha,
                          label_smoothing=self.label_smoothing,
                          lse_square_scale=self.lse_square_scale, softcap=self.softcap,
                          logit_scale=self.logit_scale, memory_budget=self.memory_budget,
                          return_z_loss=self.return_z_loss)
