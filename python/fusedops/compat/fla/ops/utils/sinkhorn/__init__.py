"""``fla.ops.utils.sinkhorn``: ``sinkhorn(logits, num_iters=20)``."""

from __future__ import annotations

import torch
from torch import Tensor

from fusedops.ops import mhc as _mhc

__all__ = ["sinkhorn"]


def sinkhorn(logits: Tensor, num_iters: int = 20) -> Tensor:
    """FLA's log-domain Sinkhorn of every ``[N, N]`` matrix: ``num_iters`` times a column then a
    row log-normalisation (ending on rows), no eps, float32 out. That is fusedops'
    ``variant="log"`` (rows first, ending on columns) on the transposed matrices."""
    if num_iters < 1:
        raise ValueError(f"num_iters must be positive, got {num_iters}")
    x = logits.float() if logits.dtype != torch.float64 else logits
    return _mhc.sinkhorn(x.transpose(-1, -2), num_iters, 0.0, variant="log").transpose(-1, -2)
