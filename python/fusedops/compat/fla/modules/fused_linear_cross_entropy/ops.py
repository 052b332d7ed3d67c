"""``fla.modules.fused_linear_cross_entropy``: the LM head and cross-entropy without
materialised logits, on :func:`fusedops.chunk_loss`."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from fusedops.compat._util import process_group_kwargs, unsupported
from fusedops.ops.chunk_loss import chunk_loss as _chunk_loss

__all__ = ["FusedLinearCrossEntropyLoss", "fused_linear_cross_entropy_loss"]


def fused_linear_cross_entropy_loss(x: Tensor, target: Tensor, weight: Tensor,
                                    bias: Optional[Tensor] = None, ignore_index: int = -100,
                                    label_smoothing: float = 0.0, logit_scale: float = 1.0,
                                    logit_softcapping: Optional[float] = None,
                                    num_chunks: int = 8, reduction: str = "mean",
                                    use_l2warp: bool = False, l2_penalty_factor: float = 1e-4,
                                    accumulate_grad_in_fp32: bool = True,
                                    process_group=None) -> Tensor:
    """``CE(x @ weight.T)`` over ``x [N, H]`` and ``target [N]``, ``"mean"`` over the
    non-ignored rows (at least 1) or ``"sum"``; fp32 scalar. ``num_chunks`` and
    ``accumulate_grad_in_fp32`` are accepted and ignored (fusedops sizes its chunks by memory
    and accumulates in fp32); ``bias`` and ``use_l2warp`` are rejected."""
    op = "fused_linear_cross_entropy_loss"
    if bias is not None:
        unsupported("fla", op, "bias", "fold the bias into the weight (an extra hidden column "
                    "of ones) or add it to the logits of fused_cross_entropy_loss")
    if use_l2warp:
        unsupported("fla", op, "use_l2warp", "apply L2Warp separately")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction: {reduction} is not supported")
    extra = process_group_kwargs("fla", op, _chunk_loss, process_group)
    return _chunk_loss(x, weight, target, ignore_index=ignore_index, reduction=reduction,
                       label_smoothing=label_smoothing, logit_scale=logit_scale,
                       logit_softcapping=logit_softcapping, **extra)


class FusedLinearCrossEntropyLoss(torch.nn.Module):
    """FLA 0.6.0's ``FusedLinearCrossEntropyLoss``: ``forward(x, target, weight, bias=None)``
    with ``x [..., H]`` and ``target [...]`` (flattened)."""

    def __init__(self, ignore_index: int = -100, label_smoothing: float = 0.0,
                 logit_scale: float = 1.0, logit_softcapping: Optional[float] = None,
                 num_chunks: int = 8, reduction: str = "mean", use_l2warp: bool = False,
                 l2_penalty_factor: float = 1e-4, accumulate_grad_in_fp32: bool = True,
                 process_group=None):
        super().__init__()
        assert reduction in ["mean", "sum"], f"reduction: {reduction} is not supported"
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing
        self.logit_scale = logit_scale
        self.logit_softcapping = logit_softcapping
        self.num_chunks = num_chunks
        self.reduction = reduction
        self.use_l2warp = use_l2warp
        self.l2_penalty_factor = l2_penalty_factor
        self.accumulate_grad_in_fp32 = accumulate_grad_in_fp32
        self.process_group = process_group

    def forward(self, x: Tensor, target: Tensor, weight: Tensor, bias: Optional[Tensor] = None):
        return fused_linear_cross_entropy_loss(
            x.reshape(-1, x.shape[-1]), target.reshape(-1), weight, bias,
            ignore_index=self.ignore_index, label_smoothing=self.label_smoothing,
            logit_scale=self.logit_scale, logit_softcapping=self.logit_softcapping,
            num_chunks=self.num_chunks, reduction=self.reduction, use_l2warp=self.use_l2warp,
            l2_penalty_factor=self.l2_penalty_factor,
            accumulate_grad_in_fp32=self.accumulate_grad_in_fp32,
            process_group=self.process_group)
