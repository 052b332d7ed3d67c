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


class RMSNormGated(torch.nn.Module):
    """Gated RMSNorm (flash-linear-attention's ``RMSNormGated`` / ``FusedRMSNormGated``), backed
    by :func:`fusedops.rms_norm_gated`.

    Defaults follow FLA's ``layernorm_gated.RMSNormGated``: eps 1e-5, ``norm_before_gate=False``
    (``y = x*silu(z) * r * weight``), a weight initialised to ones and no bias. With
    ``norm_before_gate=True`` the gate comes after the norm and may be ``"sigmoid"``;
    ``forward`` then also takes FLA ``fused_norm_gate``'s residual / prenorm / residual_in_fp32.

    Args:
        hidden_size: D.
        eps: added to the mean of squares.
        group_size: columns per rstd group (None: one group per row).
        norm_before_gate: where the gate goes (see above).
        activation: ``"silu"``/``"swish"`` or ``"sigmoid"`` (norm_before_gate only).
        elementwise_affine: learn a weight (default True).
        bias: learn a bias (default False).
        device, dtype: of the parameters.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-5, group_size: Optional[int] = None,
                 norm_before_gate: bool = False, activation: str = "silu",
                 elementwise_affine: bool = True, bias: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        if activation not in ("silu", "swish", "sigmoid"):
            raise ValueError(f"fusedops: RMSNormGated: activation must be one of 'silu', 'swish', "
                             f"'sigmoid', got {activation!r}")
        if group_size is not None and (group_size <= 0 or hidden_size % group_size):
            raise ValueError(f"fusedops: RMSNormGated: group_size must divide hidden_size: "
                             f"hidden_size = {hidden_size}, group_size = {group_size}")
        factory = {"device": device, "dtype": dtype}
        self.hidden_size = hidden_size
        self.eps = eps
        self.group_size = group_size
        self.norm_before_gate = norm_before_gate
        self.activation = activation
        self.weight = torch.nn.Parameter(torch.empty(hidden_size, **factory)) if elementwise_affine else None
        self.bias = torch.nn.Parameter(torch.empty(hidden_size, **factory)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.ones_(self.weight)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def extra_repr(self) -> str:
        return (f"{self.hidden_size}, eps={self.eps}, group_size={self.group_size}, "
                f"norm_before_gate={self.norm_before_gate}, activation={self.activation}")

    def forward(self, x: Tensor, z: Optional[Tensor] = None, residual: Optional[Tensor] = None,
                prenorm: bool = False, residual_in_fp32: bool = False):
        from .ops.rmsnorm_gated import rms_norm_gated

        return rms_norm_gated(x, z, self.weight, self.bias, self.eps, self.group_size,
                              self.norm_before_gate, self.activation, residual, prenorm,
                              residual_in_fp32)
