"""``fla.modules.layernorm_gated`` / ``fla.modules.norm.layernorm_gated``: the Mamba-2 form
(gate first by default in the module)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from fusedops import nn as _nn
from fusedops.ops.rmsnorm_gated import rmsnorm_fn as _rmsnorm_fn

__all__ = ["RMSNormGated", "rmsnorm_fn"]


def rmsnorm_fn(x: Tensor, weight: Tensor, bias: Optional[Tensor], z: Optional[Tensor] = None,
               eps: float = 1e-6, group_size: Optional[int] = None,
               norm_before_gate: bool = True) -> Tensor:
    """Grouped RMSNorm with a silu gate ``z`` before (``norm_before_gate=False``) or after the
    norm."""
    return _rmsnorm_fn(x, weight, bias, z, eps, group_size, norm_before_gate)


class RMSNormGated(_nn.RMSNormGated):
    """FLA 0.6.0's ``RMSNormGated(hidden_size, eps=1e-5, group_size=None,
    norm_before_gate=False)``: by default ``y = u * r(u) * weight`` with ``u = x * silu(z)``;
    ``forward(x, z=None)`` (:class:`fusedops.nn.RMSNormGated`)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, group_size: Optional[int] = None,
                 norm_before_gate: bool = False, device: Optional[torch.device] = None,
                 dtype: Optional[torch.dtype] = None) -> None:
        super().__init__(hidden_size, eps, group_size, norm_before_gate, device, dtype)

    def forward(self, x: Tensor, z: Optional[Tensor] = None) -> Tensor:
        return super().forward(x, z)
