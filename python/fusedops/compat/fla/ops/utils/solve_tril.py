"""``fla.ops.utils.solve_tril``."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from fusedops.ops import gated_delta_rule as _gdn

__all__ = ["solve_tril"]


def solve_tril(A: Tensor, cu_seqlens: Optional[Tensor] = None,
               chunk_indices: Optional[Tensor] = None,
               output_dtype: Optional[torch.dtype] = torch.float) -> Tensor:
    """``(I + A)^{-1}`` per chunk of a strictly lower ``[B,T,H,BT]`` A (BT in 16/32/64), in
    ``output_dtype`` (None: A's dtype). Note FLA's order: ``chunk_indices`` (accepted and
    recomputed) before ``output_dtype``."""
    if A.shape[-1] not in (16, 32, 64):
        raise ValueError(f"fusedops.compat.fla: solve_tril: A.shape[-1] (the chunk size) must be "
                         f"16, 32 or 64, got {A.shape[-1]}")
    return _gdn.solve_tril(A, cu_seqlens=cu_seqlens,
                           output_dtype=A.dtype if output_dtype is None else output_dtype)
