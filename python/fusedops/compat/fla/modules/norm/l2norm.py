"""``fla.modules.l2norm`` / ``fla.modules.norm.l2norm``."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from fusedops.ops import l2norm as _l2

__all__ = ["L2Norm", "l2_norm", "l2norm", "l2norm_bwd", "l2norm_fwd"]


def l2norm(x: Tensor, eps: float = 1e-6, output_dtype: Optional[torch.dtype] = None) -> Tensor:
    """``x / sqrt(sum(x**2, -1) + eps)``, differentiable."""
    return _l2.l2norm(x, eps, output_dtype)


l2_norm = l2norm


def l2norm_fwd(x: Tensor, eps: float = 1e-6, output_dtype: Optional[torch.dtype] = None):
    """``(y, rstd)`` with rstd float32 ``[...]``."""
    return _l2.l2norm_fwd(x, eps, output_dtype)


def l2norm_bwd(y: Tensor, rstd: Tensor, dy: Tensor, eps: float = 1e-6) -> Tensor:
    """``dx = rstd (dy - y sum(dy y, -1))`` in y's dtype."""
    return _l2.l2norm_bwd(y, rstd, dy, eps)


class L2Norm(torch.nn.Module):
    """FLA's ``L2Norm(eps=1e-6, output_dtype=None)`` module."""

    def __init__(self, eps: float = 1e-6, output_dtype: Optional[torch.dtype] = None):
        super().__init__()
        self.eps = eps
        self.output_dtype = output_dtype

    def forward(self, x: Tensor) -> Tensor:
        return l2norm(x=x, eps=self.eps, output_dtype=self.output_dtype)
