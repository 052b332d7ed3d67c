"""``fla.ops.gated_delta_rule.chunk_fwd``: ``chunk_gated_delta_rule_fwd_intra``."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from fusedops.compat._util import log2_to_natural
from fusedops.ops import gated_delta_rule as _gdn

__all__ = ["chunk_gated_delta_rule_fwd_intra"]


def chunk_gated_delta_rule_fwd_intra(k: Tensor, v: Tensor, g: Optional[Tensor] = None,
                                     beta: Optional[Tensor] = None,
                                     cu_seqlens: Optional[Tensor] = None, chunk_size: int = 64,
                                     chunk_indices: Optional[Tensor] = None):
    """``(w, u, A)``: kkt, solve and the WY representation of one chunk pass (``A`` the solved
    ``(I + A)^{-1}`` in k's dtype, through a float32 kkt matrix as in FLA, float64 for float64
    inputs; ``g`` the chunk-local cumsum in log2 units)."""
    if chunk_size not in (16, 32, 64):
        raise ValueError(f"`chunk_size` must be 16, 32, or 64, got {chunk_size}.")
    gn = log2_to_natural(g)
    acc = torch.float64 if k.dtype == torch.float64 else torch.float32  # FLA: float32
    A = _gdn.chunk_scaled_dot_kkt_fwd(k, g=gn, beta=beta, cu_seqlens=cu_seqlens,
                                      chunk_size=chunk_size, output_dtype=acc)
    A = _gdn.solve_tril(A, cu_seqlens=cu_seqlens, output_dtype=k.dtype)
    w, u = _gdn.recompute_w_u_fwd(k, v, beta, A, g=gn, cu_seqlens=cu_seqlens)
    return w, u, A
