"""``fla.ops.kda.chunk_intra``: the KDA intra-chunk forward and its backward."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from fusedops.compat._util import log2_to_natural, unsupported
from fusedops.ops import kda as _kda

__all__ = ["chunk_kda_fwd_intra", "chunk_kda_bwd_intra"]


def _no_gva(op: str, q: Tensor, v_like: Tensor) -> None:
    if v_like.shape[2] != q.shape[2]:
        unsupported("fla", op, f"GVA (HV = {v_like.shape[2]} value heads over H = {q.shape[2]} "
                    "q/k heads)", "FLA keeps dq, dk per value head here and fusedops' sub-operators "
                    "sum them over each group; use chunk_kda, whose backward handles GVA")


def chunk_kda_fwd_intra(q: Tensor, k: Tensor, v: Tensor, gk: Optional[Tensor] = None,
                        beta: Optional[Tensor] = None, scale: Optional[float] = None,
                        cu_seqlens: Optional[Tensor] = None, chunk_size: int = 64,
                        chunk_indices: Optional[Tensor] = None, safe_gate: bool = False,
                        lower_bound: Optional[float] = None, disable_recompute: bool = False,
                        use_graph: bool = False):
    """FLA 0.6's fused intra-chunk forward: ``(w, u, qg, kg, Aqk, Akk)``, with ``Aqk`` and
    ``Akk = (I + L)^{-1}`` in k's dtype and ``qg`` only with ``disable_recompute`` (None
    otherwise), as FLA returns them. ``gk`` is the chunk-local cumsum in log2 units.
    ``lower_bound`` (it only moves FLA's internal exponent shift) and ``use_graph`` are accepted
    and ignored. ``scale=None`` means ``K**-0.5``."""
    if chunk_size not in (32, 64):
        raise ValueError(f"KDA intra chunk kernel only supports chunk_size 32 or 64, got {chunk_size}.")
    gn = log2_to_natural(gk)
    Aqk, Akk = _kda.chunk_kda_fwd_intra(q, k, gn, beta, scale=scale, cu_seqlens=cu_seqlens,
                                        chunk_size=chunk_size, safe_gate=safe_gate,
                                        output_dtype=k.dtype)
    w, u, qg, kg = _kda.kda_recompute_w_u_fwd(k, v, beta, Akk, gn,
                                              q=q if disable_recompute else None,
                                              cu_seqlens=cu_seqlens)
    return w, u, qg, kg, Aqk, Akk


def chunk_kda_bwd_intra(q: Tensor, k: Tensor, g: Tensor, beta: Tensor, dAqk: Tensor, dAkk: Tensor,
                        dq: Tensor, dk: Tensor, db: Tensor, dg: Tensor,
                        cu_seqlens: Optional[Tensor] = None, chunk_indices: Optional[Tensor] = None,
                        chunk_size: int = 64, safe_gate: bool = False,
                        lower_bound: Optional[float] = None, use_graph: bool = False):
    """Adds the gradients through Aqk and Akk to the partial ``dq, dk, db, dg``; returns new
    ``(dq, dk, db, dg)``. ``g`` in log2 units. Without GVA only (see the error)."""
    _no_gva("chunk_kda_bwd_intra", q, g)
    return _kda.chunk_kda_bwd_intra(q, k, log2_to_natural(g), beta, dAqk, dAkk, dq, dk, db, dg,
                                    cu_seqlens=cu_seqlens, chunk_size=chunk_size,
                                    safe_gate=safe_gate)
