"""``fla.ops.common.chunk_scaled_dot_kkt``: ``chunk_scaled_dot_kkt_fwd``."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from fusedops.compat._util import log2_to_natural
from fusedops.ops import gated_delta_rule as _gdn

__all__ = ["chunk_scaled_dot_kkt_fwd"]


def chunk_scaled_dot_kkt_fwd(k: Tensor, g: Optional[Tensor] = None, beta: Optional[Tensor] = None,
                             cu_seqlens: Optional[Tensor] = None, chunk_size: int = 64,
                             output_dtype: torch.dtype = torch.float32,
                             chunk_indices: Optional[Tensor] = None) -> Tensor:
    """``A[i,j] = beta_i (k_i . k_j) exp2(g_i - g_j)`` for j < i within each chunk,
    ``[B,T,HV,BT]``; ``g`` is the chunk-local cumsum in FLA's log2 units. ``chunk_indices`` is
    accepted and recomputed from ``cu_seqlens``."""
    return _gdn.chunk_scaled_dot_kkt_fwd(k, g=log2_to_natural(g), beta=beta, cu_seqlens=cu_seqlens,
                                         chunk_size=chunk_size, output_dtype=output_dtype)
