"""``mindspeed_ops.api.triton.l2norm``."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from fusedops.ops import l2norm as _l2

__all__ = ["l2norm", "l2norm_fwd", "l2norm_bwd"]


def l2norm(x: Tensor, eps: float = 1e-6, output_dtype: Optional[torch.dtype] = None) -> Tensor:
    """``x / sqrt(sum(x**2, -1) + eps)``, differentiable."""
    return _l2.l2norm(x, eps, output_dtype)


def l2norm_fwd(x: Tensor, eps: float = 1e-6, output_dtype: Optional[torch.dtype] = None):
    """``(y, rstd)``, rstd float32 ``[...]``."""
    return _l2.l2norm_fwd(x, eps, output_dtype)


def l2norm_bwd(y: Tensor, rstd: Tensor, dy: Tensor, eps: float = 1e-6) -> Tensor:
    """``dx = rstd (dy - y sum(dy y, -1))``."""
    return _l2.l2norm_bwd(y, rstd, dy, eps)
