"""``fla.ops.common.chunk_o``: the chunk output and its local backward pieces: the native
sub-operators (the same signatures) with the gates ``g`` and ``g_gamma`` in FLA's log2 units."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from fusedops.compat._util import log2_to_natural
from fusedops.ops import gated_delta_rule as _gdn

__all__ = ["chunk_fwd_o", "chunk_bwd_dv_local", "chunk_bwd_dqkwg"]


def chunk_fwd_o(q: Tensor, k: Tensor, v: Tensor, h: Tensor, g: Optional[Tensor] = None,
                g_gamma: Optional[Tensor] = None, scale: Optional[float] = None,
                state_v_first: bool = False, cu_seqlens: Optional[Tensor] = None,
                chunk_size: int = 64, chunk_indices: Optional[Tensor] = None) -> Tensor:
    """``o = scale (diag(exp2(g)) Q h[n] + (M>= . Gamma . Q K^T) v)`` per chunk."""
    return _gdn.chunk_fwd_o(q, k, v, h, log2_to_natural(g), log2_to_natural(g_gamma), scale, state_v_first,
                            cu_seqlens, chunk_size, chunk_indices)


def chunk_bwd_dv_local(q: Tensor, k: Tensor, do: Tensor, g: Optional[Tensor] = None,
                       g_gamma: Optional[Tensor] = None, A: Optional[Tensor] = None,
                       scale: Optional[float] = None, cu_seqlens: Optional[Tensor] = None,
                       chunk_size: int = 64, chunk_indices: Optional[Tensor] = None) -> Tensor:
    """``dv = scale (M>= . Gamma . Q K^T)^T dO`` per chunk (a precomputed ``A`` is rejected)."""
    return _gdn.chunk_bwd_dv_local(q, k, do, log2_to_natural(g), log2_to_natural(g_gamma), A, scale,
                                   cu_seqlens, chunk_size, chunk_indices)


def chunk_bwd_dqkwg(q: Tensor, k: Tensor, v: Tensor, do: Tensor, h: Tensor, dh: Tensor,
                    w: Optional[Tensor] = None, g: Optional[Tensor] = None,
                    g_gamma: Optional[Tensor] = None, dv: Optional[Tensor] = None,
                    scale: Optional[float] = None, state_v_first: bool = False,
                    cu_seqlens: Optional[Tensor] = None, chunk_size: int = 64,
                    chunk_indices: Optional[Tensor] = None):
    """``(dq, dk, dw or None, dg or None)``; ``dg`` w.r.t. the natural-log gate cumsum (the
    chain rule through FLA's log2 units is the caller's, as with the native sub-operator)."""
    return _gdn.chunk_bwd_dqkwg(q, k, v, do, h, dh, w, log2_to_natural(g), log2_to_natural(g_gamma), dv, scale,
                                state_v_first, cu_seqlens, chunk_size, chunk_indices)
