"""``fla.modules.fused_cross_entropy``: per-row ``cross_entropy_loss`` and the
``FusedCrossEntropyLoss`` module."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from fusedops.compat._util import process_group_kwargs
from fusedops.ops.cross_entropy import fused_cross_entropy_loss as _ce

__all__ = ["FusedCrossEntropyLoss", "cross_entropy_loss"]


def cross_entropy_loss(logits: Tensor, target: Tensor, label_smoothing: float = 0.0,
                       logit_scale: float = 1.0, lse_square_scale: float = 0.0,
                       logit_softcapping: Optional[float] = None, ignore_index: int = -100,
                       inplace_backward: bool = False,
                       process_group=None) -> tuple[Tensor, Tensor]:
    """Unreduced cross entropy: ``(loss [N] fp32, z_loss [N] fp32)``, the loss including the
    z-loss ``lse_square_scale * lse**2`` and the z-loss returned for logging (no gradient);
    0 on ignored rows."""
    extra = process_group_kwargs("fla", "cross_entropy_loss", _ce, process_group)
    return _ce(logits, target, ignore_index=ignore_index, reduction="none",
               label_smoothing=label_smoothing, logit_scale=logit_scale,
               logit_softcapping=logit_softcapping, lse_square_scale=lse_square_scale,
               return_z_loss=True, inplace_backward=inplace_backward, **extra)


class FusedCrossEntropyLoss(torch.nn.Module):
    """FLA 0.6.0's ``FusedCrossEntropyLoss``: ``forward(input, target)`` returns the mean (over
    the non-ignored rows), sum or per-row loss, and ``(loss, z_loss)`` with ``return_z_loss``.
    Unlike FLA, CPU tensors are accepted, and a batch whose rows are all ignored has mean 0
    (FLA divides by 0)."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0, logit_scale: float = 1.0,
                 lse_square_scale: float = 0.0, logit_softcapping: Optional[float] = None,
                 inplace_backward: bool = False, process_group=None, return_z_loss: bool = False):
        super().__init__()
        if reduction not in ("mean", "sum", "none"):
            raise NotImplementedError(f"Unsupported reduction: {reduction}")
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.logit_scale = logit_scale
        self.lse_square_scale = lse_square_scale
        self.logit_softcapping = logit_softcapping
        self.inplace_backward = inplace_backward
        self.process_group = process_group
        self.return_z_loss = return_z_loss

    def forward(self, input: Tensor, target: Tensor):
        extra = process_group_kwargs("fla", "FusedCrossEntropyLoss", _ce, self.process_group)
        out = _ce(input, target, ignore_index=self.ignore_index, reduction=self.reduction,
                  label_smoothing=self.label_smoothing, logit_scale=self.logit_scale,
                  logit_softcapping=self.logit_softcapping,
                  lse_square_scale=self.lse_square_scale, return_z_loss=self.return_z_loss,
                  inplace_backward=self.inplace_backward, **extra)
        return out
