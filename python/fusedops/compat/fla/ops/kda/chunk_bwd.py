"""``fla.ops.kda.chunk_bwd``: ``chunk_kda_bwd_dAv`` and ``chunk_kda_bwd_wy_dqkg_fused``."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from fusedops.compat._util import log2_to_natural, state_to_kv
from fusedops.ops import kda as _kda

from .chunk_intra import _no_gva

__all__ = ["chunk_kda_bwd_dAv", "chunk_kda_bwd_wy_dqkg_fused"]


def chunk_kda_bwd_dAv(q: Tensor, k: Tensor, v: Tensor, do: Tensor, A: Optional[Tensor] = None,
                      scale: float = None, cu_seqlens: Optional[Tensor] = None,
                      chunk_size: int = 64, chunk_indices: Optional[Tensor] = None,
                      use_graph: bool = False):
    """``(dA fp32, dv)``: ``dA = scale M>= . (dO v^T)``, ``dv = (M>= . A)^T dO`` with ``A`` the
    forward's Aqk (required; q and k give only K, for the default ``scale = K**-0.5``)."""
    if A is None:
        raise ValueError("fusedops.compat.fla: chunk_kda_bwd_dAv: A (the forward's Aqk) is required")
    return _kda.chunk_kda_bwd_dAv(A, v, do, scale=scale, cu_seqlens=cu_seqlens, K=k.shape[-1])


def chunk_kda_bwd_wy_dqkg_fused(q: Tensor, k: Tensor, v: Tensor, v_new: Tensor, g: Tensor,
                                beta: Tensor, A: Tensor, h: Tensor, do: Tensor, dh: Tensor,
                                dv: Tensor, scale: Optional[float] = None,
                                state_v_first: bool = False, cu_seqlens: Optional[Tensor] = None,
                                chunk_size: int = 64, chunk_indices: Optional[Tensor] = None,
                                chunk_offsets: Optional[Tensor] = None, use_graph: bool = False):
    """``(dq, dk, dv, db, dg, dA)`` of the WY / output block (``g`` the chunk-local cumsum in
    log2 units, ``A`` = Akk, ``dv`` the total gradient of v_new; ``state_v_first`` states
    ``[..., V, K]``). Without GVA only (see the error)."""
    _no_gva("chunk_kda_bwd_wy_dqkg_fused", q, v)
    return _kda.chunk_kda_bwd_wy_dqkg_fused(
        q, k, v, v_new, log2_to_natural(g), beta, A, state_to_kv(h, state_v_first), do,
        state_to_kv(dh, state_v_first), dv, scale=scale, cu_seqlens=cu_seqlens,
        chunk_size=chunk_size)
