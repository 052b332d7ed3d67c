"""``fla.modules.fused_norm_gate`` / ``fla.modules.norm.fused_norm_gate``: normalise, then gate."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from fusedops import nn as _nn
from fusedops.ops.rmsnorm_gated import rms_norm_gated as _rms_norm_gated

__all__ = ["FusedRMSNormGated", "FusedRMSNormSwishGate", "rms_norm_gated"]


def rms_norm_gated(x: Tensor, g: Tensor, weight: Tensor, bias: Tensor, activation: str = "swish",
                   residual: Optional[Tensor] = None, prenorm: bool = False,
                   residual_in_fp32: bool = False, eps: float = 1e-6):
    """``y = (x * r * weight + bias) * act(g)`` (``act`` swish/silu or sigmoid; ``r`` the rstd of
    ``x + residual``); ``prenorm=True`` returns ``(y, x + residual)``. FLA 0.6.0's signature
    (weight and bias may be None)."""
    return _rms_norm_gated(x, g, weight, bias, activation, residual, prenorm, residual_in_fp32, eps)


class FusedRMSNormGated(_nn.FusedRMSNormGated):
    """FLA 0.6.0's ``FusedRMSNormGated(hidden_size, elementwise_affine=True, eps=1e-5,
    activation="swish")``: normalise, then gate; ``forward(x, g, residual=None, prenorm=False,
    residual_in_fp32=False)`` (:class:`fusedops.nn.FusedRMSNormGated`)."""


class FusedRMSNormSwishGate(FusedRMSNormGated):
    """FLA's ``FusedRMSNormSwishGate``: :class:`FusedRMSNormGated` with the swish gate."""

    def __init__(self, hidden_size: int, elementwise_affine: bool = True, eps: float = 1e-5,
                 device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__(hidden_size=hidden_size, elementwise_affine=elementwise_affine, eps=eps,
                         device=device, dtype=dtype)
